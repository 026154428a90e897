from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from flow_sdk.errors import RendezvousError
from flow_sdk.wire import GangMember
from flow_sdk.node.rendezvous import assign_ranks, discover, from_record, worker_env


@dataclass(frozen=True)
class M:
    instance_id: str
    address: str
    state: str = "running"


def test_ranks_follow_sorted_instance_ids_whatever_the_listing_order() -> None:
    members = [M("i-c", "10.0.0.3"), M("i-a", "10.0.0.1"), M("i-b", "10.0.0.2")]
    for me, rank in (("i-a", 0), ("i-b", 1), ("i-c", 2)):
        for order in (members, members[::-1]):
            m = assign_ranks(order, me)
            assert (m.node_rank, m.num_nodes, m.leader_address) == (rank, 3, "10.0.0.1")
            assert m.instance_ids == ("i-a", "i-b", "i-c")


def test_discover_polls_once_per_round_until_all_run() -> None:
    rounds = [[M("i-a", "a", "pending"), M("i-b", "b", "pending")],
              [M("i-a", "a"), M("i-b", "b", "pending")],
              [M("i-a", "a"), M("i-b", "b")]]
    calls = []

    def list_members() -> list[M]:
        calls.append(1)
        return rounds[min(len(calls) - 1, 2)]

    m = discover(list_members, "i-b", expected=2, minimum=2, timeout_s=10, sleep=lambda s: None)
    assert (m.node_rank, len(calls)) == (1, 3)


def test_discover_names_missing_nodes_after_timeout() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    def sleep(s: float) -> None:
        now[0] += s

    members = [M("i-a", "a"), M("i-b", "b", "terminated")]
    with pytest.raises(RendezvousError, match=r"i-b \(terminated\).*1 never appeared"):
        discover(lambda: members, "i-a", expected=3, minimum=3, timeout_s=5, clock=clock,
                 sleep=sleep)


def test_discover_polls_less_often_the_longer_it_waits() -> None:
    now, waits = [0.0], []

    def sleep(s: float) -> None:
        waits.append(s)
        now[0] += s

    members = [M("i-a", "a"), M("i-b", "b", "pending")]
    with pytest.raises(RendezvousError):
        discover(lambda: members, "i-a", expected=2, minimum=2, timeout_s=30,
                 clock=lambda: now[0], sleep=sleep)
    assert waits[0] == 0.25 and waits == sorted(waits) and max(waits) == 2.0
    assert len(waits) < 30  # at a fixed 0.25 s it would have asked 120 times


def test_discover_settles_for_min_instances_after_timeout() -> None:
    now = [0.0]
    members = [M("i-a", "a"), M("i-b", "b"), M("i-c", "c", "pending")]
    m = discover(lambda: members, "i-b", expected=3, minimum=2, timeout_s=1,
                 clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert (m.node_rank, m.num_nodes) == (1, 2)


def test_worker_env_contract_and_user_values_win() -> None:
    m = assign_ranks([M("i-a", "10.0.0.1"), M("i-b", "10.0.0.2")], "i-b")
    env = worker_env(task_id="t", membership=m, local_rank=1, slots_per_node=4, master_port=29500,
                     distributed=True, user_env={"MASTER_PORT": "1234", "X": "y"})
    assert env["RANK"] == "5" and env["LOCAL_RANK"] == "1" and env["WORLD_SIZE"] == "8"
    assert env["LOCAL_WORLD_SIZE"] == "4" and env["NODE_RANK"] == env["FLOW_NODE_RANK"] == "1"
    assert env["MASTER_ADDR"] == env["FLOW_MAIN_IP"] == "10.0.0.1"
    assert env["FLOW_NUM_NODES"] == "2" and env["FLOW_TASK_ID"] == "t"
    assert env["MASTER_PORT"] == "1234" and env["X"] == "y"


def test_manual_mode_sets_only_flow_vars() -> None:
    m = assign_ranks([M("i-a", "10.0.0.1")], "i-a")
    env = worker_env(task_id="t", membership=m, local_rank=0, slots_per_node=1, master_port=1,
                     distributed=False)
    assert "RANK" not in env and "MASTER_ADDR" not in env
    assert env["FLOW_NODE_RANK"] == "0"


# -- membership from the launcher's record ---------------------------------------------------

def _fake_clock() -> tuple[list[float], Callable[[], float], Callable[[float], None]]:
    now = [0.0]
    return now, lambda: now[0], lambda s: now.__setitem__(0, now[0] + s)


def test_ranks_from_the_record_equal_ranks_from_the_instance_list() -> None:
    listed = [M("i-0c", "10.0.0.3"), M("i-0a", "10.0.0.1"), M("i-0b", "10.0.0.2")]
    recorded = [GangMember(m.instance_id, m.address) for m in reversed(listed)]
    for me in ("i-0a", "i-0b", "i-0c"):
        from_list = discover(lambda: listed, me, expected=3, minimum=3, timeout_s=1)
        assert from_record(lambda: recorded, me, grace_s=1) == from_list


def test_the_record_is_read_again_while_absent() -> None:
    reads: list[int] = []
    _, clock, sleep = _fake_clock()

    def read() -> list[GangMember] | None:
        reads.append(1)
        return None if len(reads) < 3 else [GangMember("i-b", "b"), GangMember("i-a", "a")]

    m = from_record(read, "i-b", grace_s=10, clock=clock, sleep=sleep)
    assert m is not None and (m.node_rank, m.leader_address, len(reads)) == (1, "a", 3)


def test_an_absent_record_gives_up_after_the_grace() -> None:
    now, clock, sleep = _fake_clock()
    assert from_record(lambda: None, "i-a", grace_s=2, poll_s=0.5, clock=clock,
                       sleep=sleep) is None
    assert now[0] == 2.0


def test_a_record_without_this_node_is_stale() -> None:
    reads: list[int] = []

    def read() -> list[GangMember]:
        reads.append(1)
        return [GangMember("i-a", "a"), GangMember("i-b", "b")]

    assert from_record(read, "i-new", grace_s=10) is None
    assert reads == [1]  # a stale record is not waited on: the caller falls back at once


def test_a_record_of_queued_nodes_without_addresses_sends_the_node_to_the_provider_at_once(
        ) -> None:
    """A scheduler's launch queues the nodes before they have addresses: their record names
    them without one, and the node asks the provider instead of waiting out the grace."""
    reads = []

    def read() -> list[M]:
        reads.append(1)
        return [M("i-a", ""), M("i-b", "")]

    assert from_record(read, "i-a", grace_s=10) is None
    assert len(reads) == 1
