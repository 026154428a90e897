"""What the cluster does to a running task, on a real Slurm cluster of the test's own (these
tests kill daemons and take nodes down): a node lost with its ``slurmd`` and the job's
processes on it, a node an administrator sets down, and ``scancel`` from outside. Each fails
the task within 30 s, saying what happened and naming the node where one was lost; nothing
of the job is left. On a pool with a spare, the job outlives a lost node (``--no-kill``) and
the spare takes its rank."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flow_sdk import FlowApp, Task, current
from flow_sdk.errors import TaskCancelledError, TaskError
from flow_sdk.client.pools import pool_up
from flow_sdk.providers.slurm import SlurmProvider
from seeded_ddp import train
from flow_sdk.wire import TaskStatus
from flow_testing import wait_until
from slurm_cluster import SlurmCluster, runner_subnet

pytestmark = pytest.mark.slow
LOST_WITHIN_S = 30.0


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    own = SlurmCluster.start(tmp_path / "cluster", nodes=3, subnet=runner_subnet(110))
    monkeypatch.setenv("SLURM_CONF", str(own.conf))
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
def app(cluster: SlurmCluster, tmp_path: Path) -> FlowApp:
    return FlowApp("slurm-failures", provider="slurm",
                   provider_config={"shared_dir": str(tmp_path / "shared")})


def train_for_a_while() -> int:
    print(f"rank {current.rank} training", flush=True)
    time.sleep(300)
    return current.rank


def _running(app: FlowApp) -> tuple[Task, str, str]:
    """A 2-node task running its workers: the task, its job id and the name of node 1."""
    task = app.function(num_instances=2, max_run_time_hours=0.1)(train_for_a_while).spawn()
    wait_until(lambda: sum("training" in line for line in task.logs()) == 2, 90,
               "both ranks training")
    provider = task.provider
    assert isinstance(provider, SlurmProvider)
    job = provider.job_state(task.task_id)
    assert job is not None
    return task, job.job_id, provider.jobs.nodes(job.nodes)[1][0]


def _failed_within_bound(task: Task) -> str:
    """The task's error, once it has failed within LOST_WITHIN_S and its job has ended."""
    wait_until(lambda: task.status is TaskStatus.FAILED, LOST_WITHIN_S, "the task failed")
    assert task.wait(timeout=60) is TaskStatus.FAILED
    with pytest.raises(TaskError) as raised:
        task.result()
    return str(raised.value)


def test_a_node_lost_with_its_slurmd_fails_the_task_naming_it(
        app: FlowApp, cluster: SlurmCluster) -> None:
    task, job_id, node = _running(app)
    os.kill(cluster.pids[f"slurmd-{node}"], signal.SIGKILL)
    for pid in cluster.job_processes(job_id, node):
        os.kill(pid, signal.SIGKILL)
    # the teardown waits for Slurm to give up on the node (SlurmdTimeout) to end the job
    message = _failed_within_bound(task)
    assert f"node 1 (sl{job_id}-0001, " in message and "was lost" in message, message


def test_a_node_set_down_fails_the_task_naming_it(app: FlowApp, cluster: SlurmCluster) -> None:
    task, _, node = _running(app)
    cluster.run("scontrol", "update", f"nodename={node}", "state=down", "reason=disk_died")
    message = _failed_within_bound(task)
    assert f"node 1 ({node}) is down: disk_died" in message, message


def test_scancel_from_outside_cancels_the_task_saying_so(app: FlowApp,
                                                         cluster: SlurmCluster) -> None:
    task, job_id, _ = _running(app)
    cluster.run("scancel", job_id)
    wait_until(lambda: task.status.is_terminal, LOST_WITHIN_S, "the task ended")
    status = task.wait(timeout=60)
    with pytest.raises(TaskCancelledError) as raised:
        task.result()
    assert status is TaskStatus.CANCELLED
    assert f"job {job_id}" in str(raised.value) and "CANCELLED" in str(raised.value), (
        str(raised.value))


def test_on_a_pool_a_spare_takes_the_rank_of_a_node_lost_with_its_slurmd(
        app: FlowApp, cluster: SlurmCluster, tmp_path: Path) -> None:
    config = {"shared_dir": str(tmp_path / "shared")}
    pool = pool_up("spared", provider="slurm", provider_config=config, num_instances=2,
                   spares=1, max_run_time_hours=0.2, idle_stop="10m")
    for folder in ("reference", "resumed"):
        (tmp_path / folder).mkdir()
    try:
        trainer = app.function(num_instances=2, pool="spared", max_restarts=1)(train)
        reference = trainer.spawn(12, str(tmp_path / "reference")).result(timeout=180)
        task = trainer.spawn(12, str(tmp_path / "resumed"))
        wait_until(lambda: any("step 4" in line for line in task.logs()), 120, "step 4")
        gang = {n.node: n.instance_id for n in task.nodes()}
        provider = task.provider
        assert isinstance(provider, SlurmProvider)
        job = provider.job_state(pool.pool_id)  # the pool is one job; its nodes in order
        assert job is not None
        names = dict(zip(sorted(i.instance_id for i in pool.instances()),
                         (name for name, _ in provider.jobs.nodes(job.nodes)), strict=True))
        lost = names[gang[1]]
        os.kill(cluster.pids[f"slurmd-{lost}"], signal.SIGKILL)
        for pid in cluster.job_processes(job.job_id, lost):
            os.kill(pid, signal.SIGKILL)
        assert task.result(timeout=180) == pytest.approx(reference, abs=1e-6)
        spare = ({i.instance_id for i in task.instances()} - set(gang.values())).pop()
        assert {n.instance_id for n in task.nodes()} == {gang[0], spare}
    finally:
        pool.down()
