"""The test cluster is a real Slurm: ``srun`` and ``sbatch`` span its nodes, each node has its
own address, and stopping it leaves no process behind."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flow_sdk.system import procs
from flow_testing import wait_until
from slurm_cluster import SlurmCluster, holders, runner_subnet

pytestmark = pytest.mark.slow


def test_srun_runs_one_task_on_each_node_each_at_its_own_address(
        slurm_clean: SlurmCluster) -> None:
    done = slurm_clean.run("srun", "-N", "3", "--ntasks-per-node=1", "bash", "-c",
                           "echo $SLURMD_NODENAME $SLURM_NODEID")
    seen = sorted(tuple(line.split()) for line in done.stdout.splitlines())
    assert seen == [("n1", "0"), ("n2", "1"), ("n3", "2")]
    addresses = {}
    for node in slurm_clean.nodes:
        shown = slurm_clean.run("scontrol", "show", "node", node.name).stdout
        addresses[node.name] = shown.split("NodeAddr=")[1].split()[0]
    assert addresses == {node.name: node.address for node in slurm_clean.nodes}
    assert len(set(addresses.values())) == 3
    assert all(address.startswith("127.") for address in addresses.values())


def test_a_batch_job_on_two_nodes_runs_its_steps_and_leaves_the_queue(
        slurm_clean: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsrun bash -c 'echo step $SLURM_NODEID'\n")
    out = tmp_path / "job.out"
    job = slurm_clean.run("sbatch", "--parsable", "-N", "2", "--time=1", "-o", str(out),
                          str(script)).stdout.strip()
    assert job.isdigit()
    wait_until(lambda: out.exists() and len(out.read_text().splitlines()) == 2, 30,
               "both steps' output")
    assert sorted(out.read_text().splitlines()) == ["step 0", "step 1"]
    wait_until(lambda: not slurm_clean.run("squeue", "-h", "-j", job, check=False)
               .stdout.strip(), 30, "the job to leave the queue")


def test_stopping_a_cluster_ends_its_daemons_and_a_running_job(tmp_path: Path) -> None:
    cluster = SlurmCluster.start(tmp_path / "cluster", nodes=1, subnet=runner_subnet(100))
    try:
        pid_file = tmp_path / "sleeper.pid"
        cluster.run("sbatch", "-N", "1", "--time=5", "-o", str(tmp_path / "out"), "--wrap",
                    f"echo $$ > {pid_file}; exec sleep 300")
        wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 30,
                   "the job to start")
        sleeper = int(pid_file.read_text())
        ticks = procs.start_ticks(sleeper)
        assert ticks is not None
    finally:
        daemons = [(pid, procs.start_ticks(pid)) for pid in cluster.pids.values()]
        cluster.stop()
    deadline = time.monotonic() + 10
    while procs.is_alive(sleeper, ticks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not procs.is_alive(sleeper, ticks)
    assert not [pid for pid, started in daemons if procs.is_alive(pid, started)]
    assert not holders(cluster.root)  # no job step (slurmstepd) lingers either
