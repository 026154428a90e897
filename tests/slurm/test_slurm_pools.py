"""Pools on the test runner's real Slurm cluster: ``pool_up(provider="slurm")`` holds one job
whose nodes run the pool daemons; tasks run warm on it, one after another, on the same Slurm
nodes; the pool's idle stop ends the job itself, with no caller."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flow_sdk import FlowApp, current
from flow_sdk.client.pools import pool_up
from flow_testing import wait_until
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow
TIMEOUT_S = 60


def where(x: int) -> tuple[int, int, str]:
    return x, current.rank, os.environ["SLURMD_NODENAME"]


def test_tasks_run_warm_on_a_pool_job_that_its_idle_stop_ends(
        slurm_clean: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_clean.conf))
    config = {"shared_dir": str(tmp_path / "shared")}
    # A node within STOP_MARGIN_S (5 s) of its idle stop takes no task: the idle stop leaves
    # the test's spawns, under a loaded machine's delays, a window of 15 s after each node
    # goes idle (8 s left 3 s, and a node idle first was skipped while its peer still booted)
    pool = pool_up("warm", provider="slurm", provider_config=config, num_instances=2,
                   max_run_time_hours=0.1, idle_stop="20s")
    jobs = slurm_clean.run("squeue", "-h", "-o", "%j %D %T").stdout.split("\n")[0].split()
    assert jobs[0].startswith("flow-warm-") and jobs[1:] == ["2", "RUNNING"]
    app = FlowApp("slurm-pools", provider="slurm", provider_config=config)
    function = app.function(num_instances=2, pool="warm")(where)
    first = function.spawn(1).results(timeout=TIMEOUT_S)
    second = function.spawn(2).results(timeout=TIMEOUT_S)
    assert [r[:2] for r in first] == [(1, 0), (1, 1)]
    assert [r[:2] for r in second] == [(2, 0), (2, 1)]
    assert [r[2] for r in first] == [r[2] for r in second]  # the same two Slurm nodes
    assert len({r[2] for r in first}) == 2
    # nobody takes it down: idle, its daemons stop and the job ends itself
    wait_until(lambda: not slurm_clean.run("squeue", "-h").stdout.strip(), 60,
               "the pool's job to end after its idle stop")
    assert not pool.is_up()
