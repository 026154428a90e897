"""Fault injection on the local provider.

Every case asserts: the task reaches a terminal state within a bound, the error names the
cause, no process is left, and the logs up to the failure are readable.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flow_testing import agent_pid, processes_with_env, wait_until, worker_pids
from flow_sdk import FlowApp, PayloadError, Task, TaskFailedError, TaskStatus, TaskTimedOutError
from flow_sdk import payload as flow_payload
from flow_sdk import wire
from flow_sdk.home import tasksecrets
from flow_sdk.providers.local import LocalProvider
from flow_sdk.node.rendezvous.kvstore import KVClient

pytestmark = pytest.mark.slow

app = FlowApp("faults")


@app.function(num_instances=2, workers_per_node=2)
def sleeper() -> int:
    import time as _time

    from flow_sdk import current
    print(f"rank {current.rank} ready", flush=True)
    _time.sleep(300)
    return current.rank


def _leaked(flow_home: Path) -> int:
    deadline = time.monotonic() + 10
    while processes_with_env("FLOW_HOME", str(flow_home)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return len(processes_with_env("FLOW_HOME", str(flow_home)))


def _logs_kept(task: Task, expected_ready: int) -> str:
    ready = sum("ready" in line for line in task.logs())
    return "none" if ready >= expected_ready else f"logs ({ready}/{expected_ready} lines)"


def _all_ready(task: Task, count: int) -> None:
    wait_until(lambda: sum("ready" in ln for ln in task.logs()) == count, 90, f"{count} ranks ready")


# A runtime cap the workers are up well before, even on a loaded machine (two nodes of plain
# Python workers: up under 2 s after the launch here, 5-8 s under heavy load).
CAP_S = 18.0


def _ready_before_the_cap(task: Task, count: int) -> float:
    """Wait for ``count`` workers' "ready" lines, which must come before the runtime cap (it
    counts from the task's creation, start-up included); returns the cap's time (this
    machine's clock)."""
    cap_at = task.record().created_at + CAP_S
    wait_until(lambda: sum("ready" in ln for ln in task.logs()) == count,
               cap_at - time.time(), f"{count} workers' first lines before the {CAP_S:g} s cap")
    print(f"{count} workers ready {time.time() - cap_at + CAP_S:.1f} s after the launch")
    return cap_at


def _node(task: Task, node: int) -> str:
    return next(n.instance_id for n in task.nodes() if n.node == node)


def _provider(task: Task) -> LocalProvider:
    assert isinstance(task.provider, LocalProvider)
    return task.provider


@pytest.mark.parametrize("node", [0, 1], ids=["leader", "non-leader"])
def test_kill_9_a_worker(flow_home: Path, fault_record, node: int) -> None:
    task = sleeper.spawn()
    _all_ready(task, 4)
    os.kill(worker_pids(_provider(task), task.task_id, _node(task, node))[0], signal.SIGKILL)
    start = time.monotonic()
    assert task.wait(timeout=10) is TaskStatus.FAILED
    elapsed = time.monotonic() - start
    with pytest.raises(TaskFailedError) as info:
        task.result()
    assert (info.value.node, info.value.signal_name) == (node, "SIGKILL")
    fault_record(f"kill -9 a worker on node {node}", elapsed, _leaked(flow_home),
                 _logs_kept(task, 4))


@pytest.mark.parametrize("node", [0, 1], ids=["leader", "non-leader"])
def test_kill_9_a_node_agent(flow_home: Path, fault_record, node: int) -> None:
    task = sleeper.spawn()
    _all_ready(task, 4)
    os.kill(agent_pid(_provider(task), task.task_id, _node(task, node)), signal.SIGKILL)
    start = time.monotonic()
    assert task.wait(timeout=15) is TaskStatus.FAILED
    elapsed = time.monotonic() - start
    outcome = task.outcome()
    assert outcome is not None and outcome.node == node and f"node {node}" in outcome.message
    fault_record(f"kill -9 the node agent of node {node} ({'leader' if node == 0 else 'worker node'})",
                 elapsed, _leaked(flow_home), _logs_kept(task, 4))


def test_hung_worker_is_stopped_by_the_runtime_cap(flow_home: Path, fault_record) -> None:
    """The cap counts from the task's creation; what the workers printed before it is kept."""
    @app.function(num_instances=2, max_run_time_hours=CAP_S / 3600)
    def hang() -> None:
        import threading
        print("ready", flush=True)
        threading.Event().wait()  # never returns

    task = hang.spawn()
    cap_at = _ready_before_the_cap(task, 2)
    assert task.wait(timeout=CAP_S + 30) is TaskStatus.TIMED_OUT
    with pytest.raises(TaskTimedOutError, match="max_run_time_hours"):
        task.result()
    fault_record(f"worker hangs forever (runtime cap {CAP_S:g} s; seconds after the cap)",
                 time.time() - cap_at, _leaked(flow_home), _logs_kept(task, 2))


def test_node_dropped_during_the_start_barrier(flow_home: Path, fault_record) -> None:
    task = sleeper.with_options(num_instances=3, availability_timeout_s=3).spawn()
    victim = _provider(task).list_instances(task.task_id)[1]
    os.kill(agent_pid(_provider(task), task.task_id, victim.instance_id), signal.SIGKILL)
    start = time.monotonic()
    assert task.wait(timeout=30) is TaskStatus.FAILED
    outcome = task.outcome()
    assert outcome is not None and victim.instance_id in outcome.message
    assert "start barrier timed out" in outcome.message and "missing: node 1" in outcome.message
    fault_record("node dropped before the start barrier", time.monotonic() - start,
                 _leaked(flow_home), "none")


def test_min_instances_starts_with_the_nodes_that_came_up(flow_home: Path, fault_record) -> None:
    @app.function(num_instances=3, min_instances=2, availability_timeout_s=3)
    def world() -> tuple[int, str]:
        return (int(os.environ["FLOW_NUM_NODES"]), os.environ["WORLD_SIZE"])

    task = world.spawn()
    victim = _provider(task).list_instances(task.task_id)[2]
    os.kill(agent_pid(_provider(task), task.task_id, victim.instance_id), signal.SIGKILL)
    start = time.monotonic()
    assert task.results(timeout=60) == [(2, "2"), (2, "2")]
    fault_record("min_instances=2 of 3, one node never boots (job runs on 2)",
                 time.monotonic() - start, _leaked(flow_home), "none")


def test_below_min_instances_fails_naming_missing_nodes(flow_home: Path, fault_record) -> None:
    @app.function(num_instances=3, min_instances=2, availability_timeout_s=3)
    def never() -> None:
        return None

    task = never.spawn()
    instances = _provider(task).list_instances(task.task_id)
    for victim in instances[1:]:
        os.kill(agent_pid(_provider(task), task.task_id, victim.instance_id), signal.SIGKILL)
    start = time.monotonic()
    assert task.wait(timeout=30) is TaskStatus.FAILED
    outcome = task.outcome()
    assert outcome is not None and "need at least 2" in outcome.message
    assert all(v.instance_id in outcome.message for v in instances[1:])
    fault_record("below min_instances after the timeout", time.monotonic() - start,
                 _leaked(flow_home), "none")


def test_caller_killed_right_after_spawn(tmp_path: Path, flow_home: Path, fault_record) -> None:
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent("""
        import time
        from flow_sdk import FlowApp

        app = FlowApp("caps")

        @app.function(num_instances=2, max_run_time_hours=CAP_HOURS)
        def forever():
            print("ready", flush=True)
            time.sleep(3600)

        print(forever.spawn().task_id, flush=True)
        time.sleep(3600)   # the caller would wait; it is killed instead
    """).replace("CAP_HOURS", repr(CAP_S / 3600)))
    caller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "FLOW_HOME": str(flow_home)})
    assert caller.stdout is not None
    task = Task.from_id(caller.stdout.readline().strip())
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    cap_at = _ready_before_the_cap(task, 2)
    # no client is watching: the nodes end the task and stop themselves
    wait_until(lambda: task.outcome() is not None, CAP_S + 60, "the nodes to end the task")
    assert task.status is TaskStatus.TIMED_OUT
    fault_record(f"caller killed right after .spawn() (runtime cap {CAP_S:g} s; seconds after "
                 "the cap)", time.time() - cap_at, _leaked(flow_home), _logs_kept(task, 2))


class _Bomb:
    """Pickles fine; unpickling it on a node raises."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_explode, ())


def _explode() -> None:
    raise ImportError("module 'only_on_my_laptop' is not installed on the node")


def test_payload_that_cannot_be_unpickled(flow_home: Path, fault_record) -> None:
    @app.function(num_instances=2)
    def takes(arg: object) -> None:
        return None

    start = time.monotonic()
    with pytest.raises(ImportError, match="only_on_my_laptop"):
        takes.remote(_Bomb())
    fault_record("payload cannot be unpickled on the node", time.monotonic() - start,
                 _leaked(flow_home), "none")


def test_result_too_large_to_return(flow_home: Path, fault_record) -> None:
    @app.function(num_instances=2, environment={"FLOW_MAX_RESULT_BYTES": "100000"})
    def big() -> bytes:
        print("ready", flush=True)
        return b"x" * 1_000_000

    start = time.monotonic()
    task = big.spawn()
    with pytest.raises(PayloadError, match="above the 100,000-byte limit"):
        task.result(timeout=60)
    fault_record("result too large to return", time.monotonic() - start, _leaked(flow_home),
                 _logs_kept(task, 1))


def test_tampered_payload_is_refused_before_unpickling(
        tmp_path: Path, flow_home: Path, fault_record) -> None:
    marker = tmp_path / "unpickled"

    @app.function(num_instances=1)
    def innocent() -> int:
        return 1

    code = flow_payload.pack_parts(innocent.fn, (), {}).code
    evil = flow_payload.dumps(_Touch(str(marker)))  # a valid envelope, other content
    provider = app.provider()
    provider.store.put(wire.payload_key(flow_payload.digest(code)), evil)  # swapped in the store
    start = time.monotonic()
    with pytest.raises(TaskFailedError, match="does not match the digest"):
        innocent.remote()  # the node refuses it before any worker starts
    assert not marker.exists()  # the swapped payload was never unpickled
    fault_record("payload swapped in the store", time.monotonic() - start, _leaked(flow_home),
                 "none")


class _Touch:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (_touch, (self.path,))


def _touch(path: str) -> None:
    Path(path).write_text("unpickled")


def test_frozen_leader_at_the_start_barrier_fails_the_task_within_10_s(
        flow_home: Path, fault_record) -> None:
    """Node 2 is frozen before it arrives, so nodes 0 and 1 wait at the start barrier; then
    the leader (node 0, which hosts the store) is frozen too. Node 1 must find it within
    the heartbeat bound, not the barrier's timeout."""
    task = sleeper.with_options(num_instances=3, availability_timeout_s=120).spawn()
    provider = _provider(task)
    nodes = provider.list_instances(task.task_id)  # by instance id: the node ranks
    late = agent_pid(provider, task.task_id, nodes[2].instance_id)
    leader = agent_pid(provider, task.task_id, nodes[0].instance_id)
    os.kill(late, signal.SIGSTOP)
    stopped = [late]
    try:
        peer = KVClient(nodes[0].address, task.record().rdzv_port,
                        tasksecrets.load_task_secret(task.task_id), connect_timeout_s=60)
        try:
            wait_until(lambda: peer.get("g0/start/count") == "2", 90,
                       "nodes 0 and 1 at the start barrier")
            assert peer.get("g0/start/2") is None  # node 2 never arrived
        finally:
            peer.close()
        os.kill(leader, signal.SIGSTOP)
        stopped.append(leader)
        start = time.monotonic()
        wait_until(lambda: task.outcome() is not None, 30, "the task to end")
        elapsed = time.monotonic() - start
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        if task.outcome() is None:  # the bound was missed: stop the nodes all the same
            task.cancel()
    outcome = task.outcome()
    assert outcome is not None and outcome.status == TaskStatus.FAILED.value
    assert "lost contact with the leader" in outcome.message and "node 0" in outcome.message
    assert elapsed < 10, f"the frozen leader was found after {elapsed:.1f}s"
    assert task.wait(timeout=30) is TaskStatus.FAILED
    fault_record("frozen (SIGSTOP) leader agent while the gang waits at the start barrier, "
                 "3 nodes (issue 15)", elapsed, _leaked(flow_home), "none")
