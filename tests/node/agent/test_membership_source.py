"""Where a node agent learns its gang: the membership record the launcher wrote (signed with
the task's secret), and the provider's instance list only when that record is absent, stale
or forged. The agent here is the real one over the local provider's real store; only the
provider's instance list is replaced, to count its calls."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flow_sdk import wire
from flow_sdk.wire import signing
from flow_sdk.node.agent import generation
from flow_sdk.node.agent.main import Agent
from flow_sdk.wire import BootConfig, GangMember, MembershipRecord
from flow_sdk.providers import get_provider
from flow_sdk.providers.base import Instance
from flow_sdk.node.rendezvous import Membership, assign_ranks
from flow_sdk.spec import TaskSpec, build_task_spec

TASK = "members-20260101-000000-abcdef"
IDS = ("i-0c", "i-0a", "i-0b")


class Counted:
    """The task's instances as the provider would list them, with the calls counted."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, task_id: str) -> list[Instance]:
        self.calls += 1
        return [Instance(iid, task_id, f"10.0.0.{iid[-1]}", "running", 0.0, market="local",
                         instance_type="local-process")
                for iid in sorted(IDS)]


def _agent(me: str, tmp_path: Path, secret: str) -> tuple[Agent, Counted]:
    provider = get_provider("local", None)
    agent = Agent(BootConfig(TASK, "local", provider.config(), secret=secret), me,
                  f"10.0.0.{me[-1]}", tmp_path)
    listed = Counted()
    agent.node.provider.list_instances = listed  # type: ignore[method-assign]
    return agent, listed


def _record(generation: int, ids: tuple[str, ...], address: str = "10.0.0.") -> MembershipRecord:
    return MembershipRecord(generation, [GangMember(iid, address + iid[-1]) for iid in ids],
                            time.time())


def _write(agent: Agent, secret: str, generation: int, record: MembershipRecord) -> None:
    signed = signing.SignedStore(agent.node.provider.store, signing.secret_from_hex(secret))
    signed.put_record(wire.membership_key(TASK, generation), record)


def _listed_membership(me: str) -> Membership:
    return assign_ranks(Counted()(TASK), me)


@pytest.fixture()
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generation, "MEMBERSHIP_GRACE_S", 0.3)


def _members(agent: Agent, generation_number: int, spec: TaskSpec) -> Membership:
    return generation.membership(agent.node, generation_number, spec,
                                 spec.availability_timeout_s)


SPEC = build_task_spec(app="t", name="members", num_instances=3)


def test_the_record_gives_every_node_the_ranks_the_list_gives_without_listing(
        tmp_path: Path) -> None:
    secret = signing.new_secret()
    for me in IDS:
        agent, listed = _agent(me, tmp_path, secret)
        _write(agent, secret, 0, _record(0, IDS))
        assert _members(agent, 0, SPEC) == _listed_membership(me)
        assert listed.calls == 0


def test_an_absent_record_falls_back_to_the_provider_list(tmp_path: Path,
                                                          short_grace: None) -> None:
    agent, listed = _agent("i-0b", tmp_path, signing.new_secret())
    assert _members(agent, 0, SPEC) == _listed_membership("i-0b")
    assert listed.calls == 1


def test_a_stale_record_without_this_node_falls_back(tmp_path: Path) -> None:
    secret = signing.new_secret()
    agent, listed = _agent("i-0c", tmp_path, secret)
    _write(agent, secret, 0, _record(0, ("i-0a", "i-0b", "i-09")))  # i-0c replaced i-09
    assert _members(agent, 0, SPEC) == _listed_membership("i-0c")
    assert listed.calls == 1


def test_a_forged_record_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = signing.new_secret()
    agent, listed = _agent("i-0a", tmp_path, secret)
    # the same gang with an attacker's address as the leader, sealed with another secret
    _write(agent, signing.new_secret(), 0, _record(0, IDS, address="203.0.113."))
    membership = _members(agent, 0, SPEC)
    assert membership == _listed_membership("i-0a")
    assert membership.leader_address == "10.0.0.a"
    assert listed.calls == 1
    assert "refused a forged membership record" in capsys.readouterr().out


def test_a_later_generation_reads_its_own_record(tmp_path: Path, short_grace: None) -> None:
    secret = signing.new_secret()
    agent, listed = _agent("i-0d", tmp_path, secret)
    _write(agent, secret, 0, _record(0, IDS))
    _write(agent, secret, 1, _record(1, ("i-0a", "i-0b", "i-0d")))  # i-0d replaced i-0c
    membership = _members(agent, 1, SPEC)
    assert (membership.node_rank, membership.instance_ids) == (2, ("i-0a", "i-0b", "i-0d"))
    assert listed.calls == 0


def test_a_task_that_may_start_short_lists_which_nodes_run(tmp_path: Path) -> None:
    secret = signing.new_secret()
    agent, listed = _agent("i-0a", tmp_path, secret)
    _write(agent, secret, 0, _record(0, IDS))
    spec = build_task_spec(app="t", name="members", num_instances=3, min_instances=2)
    assert _members(agent, 0, spec) == _listed_membership("i-0a")
    assert listed.calls == 1
