"""The provider contract: one set of tests every provider passes (``local`` and the simulated
``aws`` here; see conftest.py). Launch, list, terminate, object store, log store, volumes and
gc, through the ``Provider`` interface only: nothing here branches on the provider.

Membership is pushed, not polled, on every provider: the launcher writes the gang's signed
membership record once, and each node takes its rank from it without listing the provider's
instances (its agent log says where its membership came from)."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from contract_helpers import Contract
from flow_testing import processes_with_env, wait_until

from flow_sdk import TaskStatus, lifecycle, tasksecrets, wire
from flow_sdk.wire import MembershipRecord, Outcome
from flow_sdk.wire.signing import SignedStore
from flow_sdk.providers.base import LogRecord
from flow_sdk.spec import VolumeSpec


# Each poll of a wait here asks the provider (a moto server in this process) or reads /proc:
# at wait_until's default 20 per second, the polling alone costs seconds of CPU a test.
POLL_S = 0.25


def _where_am_i() -> dict[str, Any]:
    return {"rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"]),
            "node": int(os.environ["FLOW_NODE_RANK"]), "leader": os.environ["MASTER_ADDR"]}


def _sleeps() -> None:
    time.sleep(600)


@pytest.mark.slow
def test_launch_list_and_terminate(contract: Contract, flow_home: Path) -> None:
    task = contract.app("contract").function(num_instances=2, priority="high")(
        _where_am_i).spawn()
    provider = task.provider
    try:
        listed = provider.list_instances(task.task_id)
        results = task.results(timeout=180)
    finally:
        if not task.status.is_terminal:
            task.cancel()
    assert task.status is TaskStatus.SUCCEEDED
    assert [{k: r[k] for k in ("rank", "world", "node")} for r in results] == [
        {"rank": r, "world": 2, "node": r} for r in range(2)]
    assert len(listed) == 2 and [i.instance_id for i in listed] == sorted(
        i.instance_id for i in listed)
    assert all(i.task_id == task.task_id and i.address for i in listed)
    # the nodes took their ranks from the launcher's signed membership record
    signed = SignedStore(provider.store, tasksecrets.load_task_secret(task.task_id))
    raw = signed.get_record(wire.membership_key(task.task_id, 0))
    assert raw is not None
    members = sorted(MembershipRecord.from_json(raw).members, key=lambda m: m.instance_id)
    assert {r["leader"] for r in results} == {members[0].address}
    agent_lines = task.logs(source="agent")
    assert sum("membership of generation 0 from its record" in line
               for line in agent_lines) == 2
    assert not any("asking the provider" in line for line in agent_lines)
    provider.terminate(task.task_id)  # idempotent after the task's own teardown
    assert all(i.state == "terminated" for i in provider.list_instances(task.task_id))
    wait_until(lambda: processes_with_env("FLOW_HOME", str(flow_home)) == [], 15,
               "every node process stopped", POLL_S)


@pytest.mark.slow
def test_gc_reports_on_a_dry_run_and_reclaims_an_ended_task(contract: Contract,
                                                            flow_home: Path) -> None:
    """``flow gc`` (``lifecycle.collect``) reclaims a task whose signed outcome says it ended;
    an outcome without the task's MAC (a forgery) never makes it reclaim a running task."""
    task = contract.app("contract-gc").function(priority="high")(_sleeps).spawn()
    provider = task.provider
    known = [task.task_id]  # its client record is here: not an orphan
    try:
        wait_until(lambda: any(n.phase == "running" for n in task.nodes()), 120,
                   "the node runs the function", POLL_S)
        provider.store.put_if_absent(wire.outcome_key(task.task_id), wire.to_json(
            Outcome("FAILED", "forged", time.time())))  # no MAC
        forged = lifecycle.collect(provider, known)
        assert forged.reasons == {} and forged.live_tasks == [task.task_id]
        assert [i.state for i in provider.list_instances(task.task_id)] == ["running"]
        store = SignedStore(provider.store, tasksecrets.load_task_secret(task.task_id))
        assert lifecycle.record_outcome(store, task.task_id, Outcome(
            "FAILED", "written by the test", time.time()))  # ended, not torn down

        dry = lifecycle.collect(provider, known, dry_run=True)
        assert dry.dry_run and dry.reasons == {task.task_id: "task ended FAILED"}
        assert dry.live_tasks == []
        assert [i.state for i in provider.list_instances(task.task_id)] == ["running"]

        done = lifecycle.collect(provider, known)
        assert done.reasons == {task.task_id: "task ended FAILED"}
        assert done.stopped_processes or done.terminated_instances
        assert [i.state for i in provider.list_instances(task.task_id)] == ["terminated"]
        wait_until(lambda: processes_with_env("FLOW_HOME", str(flow_home)) == [], 15,
                   "every node process stopped", POLL_S)
        assert lifecycle.collect(provider, known).reasons == {}  # nothing left to reclaim
    finally:
        provider.terminate(task.task_id)


def test_object_store(contract: Contract) -> None:
    store = contract.provider().store
    prefix = f"contract/{secrets.token_hex(4)}/"
    store.put(prefix + "a", b"one")
    assert store.get(prefix + "a") == b"one" and store.exists(prefix + "a")
    assert store.get(prefix + "missing") is None and not store.exists(prefix + "missing")
    assert store.put_if_absent(prefix + "b", b"two") is True
    assert store.put_if_absent(prefix + "b", b"three") is False
    assert store.get(prefix + "b") == b"two"
    assert store.list(prefix) == [prefix + "a", prefix + "b"]
    assert store.delete_prefix(prefix) == 2
    assert store.list(prefix) == []


def test_log_store_pages_with_a_cursor(contract: Contract) -> None:
    logs = contract.provider().logs
    task_id = f"contract-{secrets.token_hex(4)}"
    now = time.time()
    writer = logs.writer(task_id, "node0.rank0")
    writer.write([LogRecord(now, "one"), LogRecord(now + 0.001, "two")])
    writer.close()
    assert "node0.rank0" in logs.streams(task_id)
    first, cursor = logs.read(task_id, "node0.rank0")
    assert [r.text for r in first] == ["one", "two"]
    writer = logs.writer(task_id, "node0.rank0")
    writer.write([LogRecord(now + 0.002, "three")])
    writer.close()
    rest, _ = logs.read(task_id, "node0.rank0", cursor)
    assert [r.text for r in rest] == ["three"]  # nothing read twice


def test_volumes_ensure_list_delete(contract: Contract) -> None:
    volumes = contract.provider().volumes
    spec = VolumeSpec(name="contract-vol", size_gb=100, interface="file")
    made = volumes.ensure(spec)
    assert (made.name, made.interface, made.provider) == ("contract-vol", "file", contract.name)
    assert volumes.ensure(spec).location == made.location  # found, not made again
    assert [(v.name, v.interface) for v in volumes.list()] == [("contract-vol", "file")]
    assert volumes.delete("contract-vol") is True
    assert volumes.list() == []
    assert volumes.delete("contract-vol") is False
