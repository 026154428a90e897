"""A cancel on the test runner's real Slurm cluster goes through the task's signed cancel
first: the agents stop their workers and end the job themselves (Slurm records it
COMPLETED, not CANCELLED); a job whose agents do not (frozen here) is cancelled with
``scancel`` after the grace. A task that succeeded ends its job the same way; a pool's job,
whose daemons stop only when told, is cancelled at once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from flow_sdk import FlowApp
from flow_sdk.client.pools import pool_up
from flow_sdk.providers.slurm._jobs import CANCEL_GRACE_S
from flow_sdk.wire import TaskStatus
from flow_testing import wait_until
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow


def _sleeps() -> None:
    print("sleeping", flush=True)
    time.sleep(300)


def _job_state(cluster: SlurmCluster, job_id: str) -> str:
    shown = cluster.run("scontrol", "-o", "show", "job", job_id).stdout
    return shown.split("JobState=")[1].split()[0]


def test_a_cancel_lets_the_agents_end_the_job_and_scancels_a_job_that_does_not_end(
        app: FlowApp, slurm_clean: SlurmCluster) -> None:
    f = app.function(num_instances=2, max_run_time_hours=0.1)(_sleeps)
    task = f.spawn()
    wait_until(lambda: sum("sleeping" in line for line in task.logs()) == 2, 120,
               "both workers sleeping")
    job = task.provider.job_state(task.task_id)  # type: ignore[attr-defined]
    started = time.monotonic()
    task.cancel()
    assert time.monotonic() - started < CANCEL_GRACE_S
    assert _job_state(slurm_clean, job.job_id) == "COMPLETED"
    assert task.wait(timeout=30) == TaskStatus.CANCELLED

    frozen = f.spawn()
    wait_until(lambda: sum("sleeping" in line for line in frozen.logs()) == 2, 120,
               "both workers sleeping")
    job = frozen.provider.job_state(frozen.task_id)  # type: ignore[attr-defined]
    for pid in slurm_clean.job_processes(job.job_id):
        os.kill(pid, signal.SIGSTOP)  # agents and workers: nothing answers the cancel
    started = time.monotonic()
    frozen.cancel()
    assert time.monotonic() - started >= CANCEL_GRACE_S
    assert _job_state(slurm_clean, job.job_id) == "CANCELLED"
    assert slurm_clean.job_processes(job.job_id) == []


def test_a_task_that_succeeded_leaves_a_completed_job(app: FlowApp,
                                                      slurm_clean: SlurmCluster) -> None:
    f = app.function(num_instances=2, max_run_time_hours=0.1)(os.getpid)
    task = f.spawn()
    assert len(task.results(timeout=120)) == 2
    job = task.provider.job_state(task.task_id)  # type: ignore[attr-defined]
    assert _job_state(slurm_clean, job.job_id) == "COMPLETED"


def test_a_pools_job_is_cancelled_at_once_its_daemons_stop_only_when_told(
        app: FlowApp, slurm_clean: SlurmCluster, tmp_path: Path) -> None:
    pool = pool_up("held", provider="slurm", provider_config={
        "shared_dir": str(tmp_path / "shared")}, num_instances=1, max_run_time_hours=0.1,
        idle_stop="10m")
    job = pool.provider.job_state(pool.pool_id)  # type: ignore[attr-defined]
    started = time.monotonic()
    pool.down()
    assert time.monotonic() - started < CANCEL_GRACE_S
    assert _job_state(slurm_clean, job.job_id) == "CANCELLED"
