"""Fail fast and leave nothing behind: killed workers, killed agents, cancel, runtime cap."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from flow_testing import processes_with_env, wait_until
from flow_sdk import FlowApp, Task, TaskCancelledError, TaskFailedError, TaskStatus, TaskTimedOutError
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
            n.phase == "running" and len(provider.worker_pids(task.task_id, n.instance_id)) == 2
            for n in nodes)

    wait_until(all_started, 90, "both nodes to run their workers")
    wait_until(lambda: sum("ready" in line for line in task.logs()) == 4, 60,
               "every rank to print 'ready'")
    return next(n.instance_id for n in task.nodes() if n.node == node)


def test_worker_sigkill_on_node_1_fails_the_task_within_10s_naming_node_1(flow_home: Path) -> None:
    task = sleeper.spawn()
    instance = _running_node(task, 1)
    victim = task.provider.worker_pids(task.task_id, instance)[1]  # type: ignore[attr-defined]
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


@pytest.mark.parametrize("node", [1, 0], ids=["non-leader", "leader"])
def test_agent_killed_fails_the_task_naming_the_node(flow_home: Path, node: int) -> None:
    task = sleeper.spawn()
    instance = _running_node(task, node)
    os.kill(task.provider.agent_pid(task.task_id, instance), signal.SIGKILL)  # type: ignore[attr-defined]
    start = time.monotonic()
    assert task.wait(timeout=15) is TaskStatus.FAILED
    elapsed = time.monotonic() - start
    outcome = task.outcome()
    assert outcome is not None and outcome.node == node, outcome
    assert f"node {node}" in outcome.message
    assert elapsed < 15
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


def test_runtime_cap_times_out_on_the_nodes_with_logs_kept(flow_home: Path) -> None:
    capped = sleeper.with_options(max_run_time_hours=8 / 3600)  # 8 seconds
    task = capped.spawn()
    assert task.wait(timeout=60) is TaskStatus.TIMED_OUT
    with pytest.raises(TaskTimedOutError, match="max_run_time_hours"):
        task.result()
    assert any("ready" in line for line in task.logs())
    wait_until(lambda: not processes_with_env("FLOW_HOME", str(flow_home)), 10,
               "every process of the task to exit")
