"""Only what is sealed with a task's secret ends it for ``flow gc``: a store writer without the
secret (a forged outcome, a forged launch lease, a removed or rewritten task record, a forged
lease on a pool) makes it reclaim nothing, and no forged lease becomes a signed outcome."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from aws_moto_world import TEST_SECRET, AwsWorld, launch_ids, spec
from click.testing import CliRunner
from flow_testing import wait_until

from flow_sdk import FlowApp, TaskStatus, lifecycle, wire
from flow_sdk.home import tasksecrets
from flow_sdk._config import flow_home
from flow_sdk.cli import main
from flow_sdk.client.pools import pool_up
from flow_sdk.wire import LaunchLease, Outcome, TaskRecord, signing

FORGED_IDS = ("j-outcome", "j-lease", "j-age", "j-no-record", "j-replay")

# Each poll of a wait here asks the moto server (which runs in this process) or reads /proc:
# at wait_until's default 20 per second, the polling alone costs seconds of CPU a test.
POLL_S = 0.5


def _unsealed(provider: Any, key: str, record: Any) -> None:
    provider.store.put(key, wire.to_json(record))


def test_gc_judges_only_sealed_records_and_launders_no_forged_lease(aws: AwsWorld) -> None:
    provider = aws.provider()
    ids = {name: launch_ids(provider, name, spec(num_instances=1, priority="high",
                                                 max_run_time_hours=1.0),
                            created_at=time.time() - (3 * 3600 if name == "j-overdue" else 0))
           for name in ("j-gone", "j-overdue", "j-cut", *FORGED_IDS)}
    for name in ids:
        tasksecrets.save_task_secret(name, TEST_SECRET)
    sealed = signing.SignedStore(provider.store, bytes.fromhex(TEST_SECRET))
    aws.client("ec2").terminate_instances(InstanceIds=ids["j-gone"])  # its nodes went
    # j-cut's launching client was killed: it never noted how its launch ended. j-replay's
    # launch ended here ("launched"), and a store writer put back a sealed "launching" lease
    # of it: this machine's note wins.
    (flow_home() / "secrets" / "j-cut.launch").unlink()
    assert tasksecrets.launch_end("j-replay") == "launched"
    for name in ("j-cut", "j-replay"):
        sealed.put_record(wire.launch_lease_key(name),
                          LaunchLease("launching", 0.0, 120.0, "host:1"))
    _unsealed(provider, wire.outcome_key("j-outcome"), Outcome("FAILED", "forged", 0.0))
    _unsealed(provider, wire.launch_lease_key("j-lease"),
              LaunchLease("rolled-back", time.time(), 120.0, "forger"))
    _unsealed(provider, wire.task_key("j-age"), TaskRecord(
        "j-age", spec(max_run_time_hours=1.0).model_dump(mode="json"), "0" * 64, 0.0,
        29400, 29500))
    provider.store.delete_prefix(wire.task_key("j-no-record"))

    found, running = lifecycle.signed_ends(provider)
    assert found == {
        "j-gone": "its gang launched and no instance of it is up any more",
        "j-overdue": "task is past its max_run_time_hours and wrote no outcome",
        "j-cut": found["j-cut"]}
    assert found["j-cut"].startswith("its launch was cut short: the launching client (host:1)")
    assert sorted(running) == sorted(set(ids) - {"j-no-record"})

    report = lifecycle.collect(provider, known=set(ids))
    assert report.reasons == found
    assert sorted(aws.non_terminated()) == sorted(i for name in FORGED_IDS for i in ids[name])
    for name in FORGED_IDS:  # no forgery was laundered into a signed "rolled back" outcome
        assert lifecycle.outcome_of(sealed, name) is None, name
    cut = lifecycle.outcome_of(sealed, "j-cut")
    assert cut is not None and cut.status == "CANCELLED"  # its real, sealed lease said so
    for name in FORGED_IDS:
        provider.terminate(name)


def _waits(started: str, release: str) -> int:
    import os
    import time
    from pathlib import Path

    Path(started).write_text("up")
    deadline = time.monotonic() + 300
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise TimeoutError("never released")
        time.sleep(0.05)
    return 42


def _flow_gc() -> list[dict[str, Any]]:
    """``flow gc --json``: the command itself, run in this process (no interpreter to start);
    it judges from what this machine's flow directory and the store hold, as a new one would."""
    done = CliRunner().invoke(main, ["gc", "--json"])
    assert done.exit_code == 0 and done.exception is None, done.output
    return [entry for entry in json.loads(done.stdout) if entry.get("provider") == "aws-sim"]


@pytest.mark.slow
def test_forged_leases_and_records_leave_the_task_and_the_pool_running(
        aws: AwsWorld, tmp_path: Path) -> None:
    config = aws.sim_config()
    app = FlowApp("gc-forgeries", provider="aws-sim", provider_config=config)
    started, release = tmp_path / "started", tmp_path / "release"
    task = app.function(max_run_time_hours=1.0, priority="high", quiet=True)(
        _waits).spawn(str(started), str(release))  # it boots while the pool comes up
    try:
        pool = pool_up("kept", provider="aws-sim", provider_config=config, num_instances=1,
                       idle_stop="30m")
    except BaseException:
        task.cancel()
        raise
    try:
        wait_until(started.exists, 180, "the task's function to run", 0.1)
        store = task.provider.store
        record_key = wire.task_key(task.task_id)
        lease_key = wire.launch_lease_key(task.task_id)
        pool_lease_key = wire.launch_lease_key(pool.pool_id)
        genuine = {key: store.get(key) for key in (record_key, lease_key, pool_lease_key)}
        assert all(data is not None for data in genuine.values())
        old_record = TaskRecord.from_json(genuine[record_key] or b"")
        forgeries: dict[str, dict[str, bytes | None]] = {
            "rolled-back leases": {
                lease_key: wire.to_json(LaunchLease("rolled-back", time.time(), 120, "x")),
                pool_lease_key: wire.to_json(LaunchLease("rolled-back", time.time(), 120,
                                                         "x"))},
            "stale launching leases": {
                lease_key: wire.to_json(LaunchLease("launching", 0.0, 120, "x")),
                pool_lease_key: wire.to_json(LaunchLease("launching", 0.0, 120, "x"))},
            "a deleted task record": {record_key: None},
            "a task record from 1970": {record_key: wire.to_json(TaskRecord(
                task.task_id, old_record.spec, old_record.payload_digest, 0.0,
                old_record.rdzv_port, old_record.master_port, old_record.python,
                old_record.code_digest))},
        }
        for what, objects in forgeries.items():
            for key, data in objects.items():
                if data is None:
                    store.delete_prefix(key)
                else:
                    store.put(key, data)
            [report] = _flow_gc()
            assert report["terminated_instances"] == [] and report["deleted"] == [], what
            assert report["reasons"] == {} and report["stopped_processes"] == [], what
            assert {task.task_id, pool.pool_id} <= set(report["live_tasks"]), what
            assert [i.state for i in task.instances()] == ["running"], what
            assert pool.is_up(), what
            for key, data in genuine.items():
                store.put(key, data or b"")
        assert lifecycle.outcome_of(task.store, task.task_id) is None  # nothing laundered
        release.write_text("go")
        assert task.result(timeout=180) == 42
        assert task.status is TaskStatus.SUCCEEDED
        wait_until(lambda: [m.state for m in pool.members().values()] == ["idle"], 60,
                   "the pool's node idle again", POLL_S)
    finally:
        if not task.status.is_terminal:
            task.cancel()
        pool.down()
    wait_until(lambda: aws.non_terminated() == [], 60, "every instance terminated", POLL_S)
