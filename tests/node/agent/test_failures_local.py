"""Fail fast and leave nothing behind (the spine's contract; ``tests/faults`` has the rest)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from flow_testing import processes_with_env, wait_until, worker_pids
from flow_sdk import FlowApp, Task, TaskCancelledError, TaskFailedError, TaskStatus
from flow_sdk.providers.local import LocalProvider

pytestmark = pytest.mark.slow

app = FlowApp("faults")


@app.function(num_instances=2, workers_per_node=2)
def sleeper() -> None:
    import time
    from flow_sdk import current
    print(f"rank {current.rank} ready", flush=True)
    time.sleep(300)


def _running_node(task: Task, node: int) -> str:
    """Wait until every node runs all its workers; return ``node``'s instance id."""
    provider = task.provider
    assert isinstance(provider, LocalProvider)

    def all_started() -> bool:
        nodes = task.nodes()
        return len(nodes) == 2 and all(
            n.phase == "running" and len(worker_pids(provider, task.task_id, n.instance_id)) == 2
            for n in nodes)

    wait_until(all_started, 90, "both nodes to run their workers")
    wait_until(lambda: sum("ready" in line for line in task.logs()) == 4, 60,
               "every rank to print 'ready'")
    return next(n.instance_id for n in task.nodes() if n.node == node)


def test_worker_sigkill_on_node_1_fails_the_task_within_10s_naming_node_1(flow_home: Path) -> None:
    task = sleeper.spawn()
    instance = _running_node(task, 1)
    victim = worker_pids(task.provider, task.task_id, instance)[1]  # type: ignore[arg-type]
    os.kill(victim, signal.SIGKILL)
    start = time.monotonic()
    assert task.wait(timeout=10) is TaskStatus.FAILED
    assert time.monotonic() - start < 10
    with pytest.raises(TaskFailedError) as info:
        task.result()
    err = info.value
    assert (err.node, err.rank, err.signal_name) == (1, 3, "SIGKILL")
    assert "node 1" in str(err) and "SIGKILL" in str(err)
    assert any("rank 3 ready" in line for line in err.log_tail)
    wait_until(lambda: not processes_with_env("FLOW_HOME", str(flow_home)), 10,
               "every process of the task to exit")


def test_cancel_leaves_no_process(flow_home: Path) -> None:
    task = sleeper.spawn()
    _running_node(task, 0)
    assert processes_with_env("FLOW_HOME", str(flow_home))  # agents and workers are up
    task.cancel()
    assert task.status is TaskStatus.CANCELLED
    assert processes_with_env("FLOW_HOME", str(flow_home)) == []
    with pytest.raises(TaskCancelledError):
        task.result(timeout=5)
    assert any("ready" in line for line in task.logs())  # logs outlive the nodes
