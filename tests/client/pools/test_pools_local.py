"""Pools on the local provider: warm nodes that run one task after another.

A pool's nodes run the pool daemon; a task on it forks its agent and workers from the node's
warm interpreter, stores its code once (by digest), and leaves nothing behind for the next
task: no process, file or environment variable. A task the pool's secret did not seal is
refused; a task that does not fit gets one error naming the mismatch; the nodes stop
themselves after their idle time; a spare takes a lost node's rank.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest
from flow_testing import wait_until
from seeded_ddp import train

from flow_sdk import FlowApp, wire
from flow_sdk.system import procs
from flow_sdk.client.pools import Pool, pool_up
from flow_sdk.errors import PoolMismatchError
from flow_sdk.wire import signing
from flow_sdk.wire.pools import Assignment, assignment_key, sequence_prefix

pytestmark = pytest.mark.slow

app = FlowApp("pools")


def _allreduce(x: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank()) + x])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return {"sum": float(value.item()), "pid": os.getpid(), "cwd": os.getcwd()}


def _leave_traces(tag: str) -> dict[str, Any]:
    """What a careless task leaves: files in its directory and TMPDIR, an environment
    variable, and a process that detached itself (a new session, a double fork)."""
    import tempfile

    Path("left-behind.txt").write_text(tag)
    with tempfile.NamedTemporaryFile(prefix="flow-left-", delete=False) as fh:
        fh.write(tag.encode())
    os.environ["FLOW_TEST_LEFT"] = tag
    # (the grandchild holds none of the worker's output: the agent would wait 5 s for it)
    detached = subprocess.Popen(
        [sys.executable, "-c", "import os, subprocess, sys, time; os.setsid(); "
         "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
         "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
         "print(p.pid, flush=True)"], stdout=subprocess.PIPE, text=True)
    grandchild = int(detached.stdout.readline())
    detached.wait()
    return {"cwd": os.getcwd(), "tmp": fh.name, "pid": grandchild}


def _look_for_traces(traces: dict[str, Any]) -> dict[str, Any]:
    try:
        os.kill(traces["pid"], 0)
        alive = True
    except ProcessLookupError:
        alive = False
    return {"process": alive, "cwd_file": Path(traces["cwd"], "left-behind.txt").exists(),
            "tmp_file": Path(traces["tmp"]).exists(), "env": os.environ.get("FLOW_TEST_LEFT"),
            "same_cwd": os.getcwd() == traces["cwd"]}


def _agent_lines(task: Any) -> list[str]:
    return task.logs(source="agent")


def test_tasks_run_warm_store_their_code_once_and_leave_nothing_behind(
        flow_home: Path) -> None:
    pool = pool_up("dev", num_instances=2, idle_stop="10m")
    try:
        warm = app.function(num_instances=2, workers_per_node=2, pool="dev",
                            quiet=True)(_allreduce)
        payloads = f"tasks/{pool.pool_id}/payloads/"
        first = warm.spawn(1.0)
        assert [r["sum"] for r in first.results(timeout=120)] == [10.0] * 4
        stored = set(pool.provider.store.list(payloads))
        second = warm.spawn(2.0)
        assert [r["sum"] for r in second.results(timeout=120)] == [14.0] * 4
        # ids: the pool's, the function's name and the task's place in the pool's order
        assert [first.task_id, second.task_id] == [f"{pool.pool_id}.allreduce-0",
                                                   f"{pool.pool_id}.allreduce-1"]
        assert len(second.task_id) <= 40
        added = set(pool.provider.store.list(payloads)) - stored
        record = second.record()
        # only the new arguments were stored: the code is the first task's, by digest
        assert record.code_digest == first.record().code_digest
        assert added == {wire.payload_key(record.payload_digest, pool.pool_id)}
        assert any("workers fork from the node's warm" in line for line in _agent_lines(second))
        assert all(i.state == "running" for i in pool.instances())  # nodes outlived both

        careless = app.function(num_instances=2, pool="dev", quiet=True)
        traces = careless(_leave_traces).spawn("first").results(timeout=120)
        found = careless(_look_for_traces).spawn(traces[0]).results(timeout=120)
        assert found[0] == {"process": False, "cwd_file": False, "tmp_file": False,
                            "env": None, "same_cwd": False}
        # and on the node itself: below each daemon no process, in its folder no task
        daemons = [rec["pid"] for rec in _instance_records(flow_home, pool.pool_id)]
        wait_until(lambda: all(not procs.descendants(pid) for pid in daemons), 20,
                   "every task process gone")
        folders = [Path(rec["workdir"], "tasks")
                   for rec in _instance_records(flow_home, pool.pool_id)]
        # the sweep removes a task's folder once its processes are gone: a moment later
        wait_until(lambda: all(not any(f.iterdir()) for f in folders), 20,
                   "every task folder gone")
    finally:
        pool.down()
    assert not any(i.state == "running" for i in pool.instances())


def _instance_records(flow_home: Path, pool_id: str) -> list[dict[str, Any]]:
    folder = flow_home / "local" / "instances" / pool_id
    return [json.loads(p.read_text()) for p in sorted(folder.glob("i-*.json"))]


def test_idle_nodes_stop_themselves_and_gc_then_forgets_nothing_live(flow_home: Path) -> None:
    pool = pool_up("brief", num_instances=2, idle_stop="2s")
    wait_until(lambda: not any(i.state == "running" for i in pool.instances()), 30,
               "the nodes' idle stop")
    assert pool.status().state == "stopped"
    assert procs.pids_with_env("FLOW_HOME", [str(flow_home)]) == []


def _flow(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["flow", *argv], capture_output=True, text=True, timeout=120,
                          env=env)


def test_gc_reclaims_a_pool_whose_pool_up_was_killed_and_keeps_a_live_one(
        flow_home: Path) -> None:
    live = pool_up("live", num_instances=1, idle_stop="10m")
    try:
        up = subprocess.Popen(["flow", "pool", "up", "half", "-N", "2", "--idle-stop", "10m"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        folder = flow_home / "local" / "instances"
        wait_until(lambda: any(p.name.startswith("half-") and len(list(p.glob("i-*.json"))) == 2
                               for p in folder.iterdir()), 60, "the half pool's nodes")
        up.send_signal(signal.SIGKILL)
        up.wait()
        half = Pool.named("half")
        assert any(i.state == "running" for i in half.instances())
        listed = _flow("pool", "list")
        assert listed.returncode == 0 and "half" in listed.stdout and "live" in listed.stdout
        assert listed.stdout.splitlines()[0].split() == [
            "NAME", "PROVIDER", "STATE", "NODES", "IDLE", "$/H", "AUTO-STOP"]
        [row] = [line for line in listed.stdout.splitlines() if line.startswith("live ")]
        assert re.fullmatch(r"live\s+local\s+up\s+1 \(1 idle\)\s+\d+s\s+0\.0000\s+in \d+s",
                            row), row
        gc = _flow("gc")
        assert gc.returncode == 0, gc.stdout + gc.stderr
        assert "half-made pool half" in gc.stdout
        assert not any(i.state == "running" for i in half.instances())
        assert all(i.state == "running" for i in live.instances())  # a live pool stays
        assert "half" not in _flow("pool", "list").stdout
    finally:
        down = _flow("pool", "down", "live")
        assert down.returncode == 0, down.stderr
    assert procs.pids_with_env("FLOW_HOME", [str(flow_home)]) == []


def test_a_spare_takes_a_lost_nodes_rank_and_training_ends_with_the_same_weights(
        flow_home: Path, tmp_path: Path) -> None:
    reference_dir = tmp_path / "reference"
    resumed_dir = tmp_path / "resumed"
    reference_dir.mkdir()
    resumed_dir.mkdir()
    pool = pool_up("spare", num_instances=2, spares=1, idle_stop="10m")
    try:
        trainer = app.function(num_instances=2, pool="spare", max_restarts=1,
                               quiet=True)(train)
        reference = trainer.spawn(12, str(reference_dir)).result(timeout=180)
        task = trainer.spawn(12, str(resumed_dir))
        wait_until(lambda: any("step 4" in line for line in task.logs()), 120, "step 4")
        gang = {n.node: n.instance_id for n in task.nodes()}
        member = pool.members()[gang[1]]
        os.kill(member.agent_pid, signal.SIGKILL)  # node 1's agent, mid-training
        resumed = task.result(timeout=180)
        assert resumed == pytest.approx(reference, abs=1e-6)
        spare = ({i.instance_id for i in task.instances()} - set(gang.values())).pop()
        # the spare joined the gang in node 1's place, with no boot (ranks follow sorted ids)
        assert {n.instance_id for n in task.nodes()} == {gang[0], spare}
        assert len(pool.instances()) == 3
        assert any("takes" in line and spare in line for line in task.logs(source="agent"))
    finally:
        pool.down()


# -- one 1-node pool serves the three tests below (they come last, so it stops with the module)


@pytest.fixture(scope="module")
def _small_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Pool]]:
    """A 1-node pool under a FLOW_HOME of its own, brought up once for the tests that each
    need one idle node; down (and nothing of it left running) after the last of them."""
    home = tmp_path_factory.mktemp("small-pool-home")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FLOW_HOME", str(home))
        pool = pool_up("small", num_instances=1, idle_stop="10m")
    try:
        yield home, pool
    finally:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("FLOW_HOME", str(home))
            pool.down()
        wait_until(lambda: procs.pids_with_env("FLOW_HOME", [str(home)]) == [], 10,
                   "the small pool's processes to end")


@pytest.fixture
def small(_small_pool: tuple[Path, Pool], monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Pool]:
    """The shared 1-node pool "small", with this test's FLOW_HOME set to the pool's."""
    home, pool = _small_pool
    monkeypatch.setenv("FLOW_HOME", str(home))
    return home, pool


def _next_number(pool: Pool) -> int:
    """The place in the pool's order its next task takes: after every claim so far."""
    return len(pool.provider.store.list(sequence_prefix(pool.pool_id)))


def test_a_task_not_sealed_with_the_pools_secret_is_refused(
        small: tuple[Path, Pool]) -> None:
    home, pool = small
    [node] = pool.instances()
    number = _next_number(pool)  # the assignment the node would serve next
    forger = signing.new_secret()  # not the pool's
    task_id = f"{pool.pool_id}.forged-{number + 1}"
    key = assignment_key(pool.pool_id, node.instance_id, number)
    signing.SignedStore(pool.provider.store, signing.secret_from_hex(forger)).put_record(
        key, Assignment(number, task_id, "run", signing.seal_secret(
            signing.secret_from_hex(forger), key, bytes(32)), time.time()))
    boot = home / "local" / "logs" / pool.pool_id / f"boot.{node.instance_id}.log"
    wait_until(lambda: f"refused assignment {number}" in boot.read_text(), 30, "the refusal")
    assert not (Path(_instance_records(home, pool.pool_id)[0]["workdir"], "tasks",
                     task_id)).exists()
    # the pool goes on serving its own tasks, after the refused number
    ok = app.function(pool="small", quiet=True)(_allreduce)
    assert ok.remote(1.0)["sum"] == 1.0


def test_a_task_that_does_not_fit_names_the_mismatch_and_launches_nothing(
        small: tuple[Path, Pool]) -> None:
    _, pool = small
    claims = pool.provider.store.list(sequence_prefix(pool.pool_id))
    big = app.function(num_instances=3, spares=1, pool="small", quiet=True)(_allreduce)
    with pytest.raises(PoolMismatchError) as info:
        big.spawn(0.0)
    assert sorted(info.value.fields) == ["num_instances", "spares"]
    assert "pool 'small' has 1" in str(info.value)
    mounts = app.function(pool="small", volumes={"/shared/ckpt": "ckpt"},
                          quiet=True)(_allreduce)
    with pytest.raises(PoolMismatchError) as info:
        mounts.spawn(0.0)
    [problem] = info.value.problems
    assert problem.field == "volumes"
    assert ("make the pool again with them, `flow pool down small` then `flow pool up "
            "small -N 1 --idle-stop 10m --volume /shared/ckpt=ckpt`") in problem.message
    assert pool.provider.store.list(sequence_prefix(pool.pool_id)) == claims  # no new task


def test_a_task_that_sets_start_up_variables_falls_back_to_a_cold_start(
        small: tuple[Path, Pool]) -> None:
    seeded = app.function(pool="small", environment={"PYTHONHASHSEED": "7"},
                          quiet=True)(_allreduce)
    task = seeded.spawn(3.0)
    assert task.result(timeout=120)["sum"] == 3.0
    assert any("cold start" in line and "PYTHONHASHSEED" in line
               for line in _agent_lines(task))
