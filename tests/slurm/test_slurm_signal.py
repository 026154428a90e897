"""Slurm's warning before a job's time limit (``--signal=USR1@300``) on the test runner's real
Slurm cluster: the signal Slurm sends then reaches every process of the job, so the test
sends it the same way (``scancel --signal=USR1``). A worker that catches SIGUSR1 gets it and
can write a checkpoint; a worker that does not is not killed by it; the agent logs which ranks
catch it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from flow_sdk import FlowApp, current
from flow_sdk.providers.slurm import SlurmProvider
from flow_sdk.wire import TaskStatus
from flow_testing import wait_until
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow


def checkpoint_on_warning(folder: str) -> str:
    """Rank 0 writes a checkpoint when warned; rank 1 does not listen. Both wait for the
    test to release them."""
    done = Path(folder) / f"released-{current.rank}"
    if current.rank == 0:
        signal.signal(signal.SIGUSR1, lambda *_: Path(folder, "checkpoint").write_text("saved"))
    print(f"rank {current.rank} ready", flush=True)
    while not done.exists():
        time.sleep(0.1)
    return f"rank {current.rank} finished"


def test_the_time_limit_warning_reaches_the_workers_that_catch_it_and_kills_none(
        slurm_clean: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_clean.conf))
    app = FlowApp("slurm-signal", provider="slurm",
                  provider_config={"shared_dir": str(tmp_path / "shared")})
    folder = tmp_path / "work"
    folder.mkdir()
    task = app.function(num_instances=2, max_run_time_hours=0.1)(checkpoint_on_warning).spawn(
        str(folder))
    try:
        script = next((tmp_path / "shared" / "jobs" / task.task_id).glob("batch.sh")).read_text()
        assert "#SBATCH --signal=USR1@240" in script.splitlines()  # half of its 8 minutes
        wait_until(lambda: sum("ready" in line for line in task.logs()) == 2, 90, "both ranks")
        provider = task.provider
        assert isinstance(provider, SlurmProvider)
        job = provider.job_state(task.task_id)
        assert job is not None
        slurm_clean.run("scancel", "--signal=USR1", job.job_id)  # what Slurm does at --signal time
        wait_until(lambda: (folder / "checkpoint").exists(), 30, "rank 0's checkpoint")

        def said(words: str) -> bool:
            return any("SIGUSR1" in line and words in line for line in task.logs(source="agent"))

        # Each node's agent says it in its own log stream, and one can come well after the other.
        wait_until(lambda: said("rank 0 catches it") and said("rank 1 does not"), 30,
                   "node 0's agent saying rank 0 catches the warning and node 1's that rank 1 "
                   "does not")
        time.sleep(1)
        assert task.status is TaskStatus.RUNNING  # rank 1 was not killed by it
        for rank in (0, 1):
            (folder / f"released-{rank}").write_text("go")
        assert task.results(timeout=60) == ["rank 0 finished", "rank 1 finished"]
        assert os.path.exists(folder / "checkpoint")
    finally:  # a failed check leaves no job behind
        if not task.status.is_terminal:
            task.cancel()
