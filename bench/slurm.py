"""The Slurm provider against submitit and ``sbatch`` + ``srun torchrun``, side by side in one
run on one real Slurm cluster.

    pip install submitit   # the baseline; not a dependency of the SDK
    python bench/slurm.py [--repeats 7]

A 3-node cluster starts on this machine (``tests/slurm_cluster.py``: munged, slurmctld and
three slurmd on loopback addresses). Three comparisons, each alternating its sides round by
round:

- cold: the same trivial function on 2 nodes, one task per node, every rank's result waited
  for: ``.remote()`` on ``provider="slurm"`` (a new job on idle nodes) against submitit's
  ``executor.submit(fn).results()`` with the same shape. Target: at most 1.0x submitit.
- warm: the same function on a 2-node pool (``pool_up(provider="slurm")``, one job holding
  the nodes) against the same submitit call. Target: at most 0.2x submitit.
- DDP: a 2x2 gloo all-reduce and one DDP step, ``.remote()`` against a batch script that
  ``srun``s ``torchrun --nnodes 2 --nproc-per-node 2`` (c10d rendezvous on the first node),
  submitted with ``sbatch`` and polled with ``squeue`` every 0.1 s. Target: at most 1.0x.
- over SSH: the cold ``.remote()`` from another machine (``login=``, through an OpenSSH
  server on loopback standing in for the login node: ``tests/slurm_login.py``) against the
  same call on the login node. No target: what the one SSH connection costs.

The first flow run builds the node environment for this SDK's digest and is reported on its
own ("first").
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from slurm_cluster import SlurmCluster  # noqa: E402
import slurm_login  # noqa: E402


def rank_of() -> int:
    return int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))


DDP_STEP = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
model(torch.ones(1, 2)).sum().backward()
dist.destroy_process_group()
assert value.item() == 10.0
"""


def ddp_step() -> float:
    namespace: dict[str, Any] = {}
    exec(DDP_STEP, namespace)  # the very code torchrun runs on the other side
    return float(namespace["value"].item())


def torchrun_batch(work: Path, script: Path) -> Path:
    """The batch script a torchrun user writes: 2 nodes, torchrun on each through srun."""
    batch = work / "torchrun.sbatch"
    batch.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --nodes=2
        #SBATCH --ntasks-per-node=1
        #SBATCH --time=10
        #SBATCH --output={work}/torchrun-%j.out
        head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
        addr=$(scontrol -o show node "$head" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
        srun torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
            --rdzv-endpoint "$addr:29533" --rdzv-id "$SLURM_JOB_ID" {script}
        """))
    return batch


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    import submitit

    logging.getLogger("submitit").setLevel(logging.ERROR)  # it warns at every sacct it tries
    from flow_sdk import FlowApp
    from flow_sdk.client.pools import pool_up

    work = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    cluster = SlurmCluster.start(work / "cluster", nodes=3, subnet=150)
    os.environ["SLURM_CONF"] = str(cluster.conf)
    os.environ["FLOW_HOME"] = str(work / "flow-home")
    config = {"shared_dir": str(work / "shared")}
    try:
        with slurm_login.running(work / "login", cluster.conf) as node:
            app = FlowApp("bench-slurm", provider="slurm", provider_config=config)
            laptop = FlowApp("bench-slurm", provider="slurm", provider_config={
                **config, "login": node.name, "ssh_config": str(node.ssh_config),
                "python": sys.executable})
            over_ssh = laptop.function(num_instances=2, max_run_time_hours=0.1, quiet=True)(
                rank_of)
            cold = app.function(num_instances=2, max_run_time_hours=0.1, quiet=True)(rank_of)
            ddp = app.function(num_instances=2, workers_per_node=2, max_run_time_hours=0.1,
                               quiet=True)(ddp_step)
            executor = submitit.AutoExecutor(folder=str(work / "submitit"), cluster="slurm")
            executor.update_parameters(nodes=2, tasks_per_node=1, timeout_min=10,
                                       slurm_partition=cluster.partition)
            script = work / "ddp_step.py"
            # leave as flow's workers do (os._exit after flushing): gloo's static teardown can
            # abort a process at exit, and torchrun then restarts or hangs the whole job
            script.write_text(DDP_STEP + "import os, sys\nsys.stdout.flush()\nos._exit(0)\n")
            batch = torchrun_batch(work, script)

            def submitit_once() -> None:
                assert sorted(executor.submit(rank_of).results()) == [0, 1]

            def torchrun_once() -> None:
                """Submit, then poll as flow does (``sbatch --wait`` polls at growing intervals,
                seconds apart, which would charge its own sleep to torchrun)."""
                job = cluster.run("sbatch", "--parsable", str(batch)).stdout.strip()
                while cluster.run("squeue", "-h", "-j", job, check=False).stdout.strip():
                    time.sleep(0.1)
                shown = cluster.run("scontrol", "-o", "show", "job", job).stdout
                assert " JobState=COMPLETED " in shown, shown

            first = timed(lambda: cold.remote())
            submitit_once()  # its first job, for the page cache
            torchrun_once()
            over_ssh.remote()  # its connection's first use
            times: dict[str, list[float]] = {side: [] for side in (
                "flow cold", "submitit", "flow DDP 2x2", "sbatch + srun torchrun",
                "flow cold, over SSH")}
            for _ in range(args.repeats):
                times["flow cold"].append(timed(lambda: cold.remote()))
                times["submitit"].append(timed(submitit_once))
                times["flow cold, over SSH"].append(timed(lambda: over_ssh.remote()))
                times["flow DDP 2x2"].append(timed(lambda: ddp.remote()))
                times["sbatch + srun torchrun"].append(timed(torchrun_once))
            pool = pool_up("bench", provider="slurm", provider_config=config, num_instances=2,
                           max_run_time_hours=0.2, idle_stop="10m")
            try:
                warm = app.function(num_instances=2, pool="bench", quiet=True)(rank_of)
                warm.remote()  # the pool's first task
                times["flow warm (pool)"] = []
                times["submitit (again)"] = []
                for _ in range(args.repeats):
                    times["flow warm (pool)"].append(timed(lambda: warm.remote()))
                    times["submitit (again)"].append(timed(submitit_once))
            finally:
                pool.down()
            report(first, times)
    finally:
        cluster.stop()


def report(first: float, times: dict[str, list[float]]) -> None:
    medians: dict[str, float] = {side: statistics.median(values)
                                 for side, values in times.items()}
    print(f"flow first run (builds the node environment): {first:.2f} s")
    for side, values in times.items():
        print(f"{side:24s} median {medians[side]:.2f} s over {len(values)} runs "
              f"({', '.join(f'{v:.2f}' for v in values)})")
    for ours, theirs, target in (("flow cold", "submitit", 1.0),
                                 ("flow warm (pool)", "submitit (again)", 0.2),
                                 ("flow DDP 2x2", "sbatch + srun torchrun", 1.0)):
        print(f"{ours} / {theirs}: {medians[ours] / medians[theirs]:.2f}x "
              f"(target at most {target}x)")
    print(f"flow cold, over SSH / flow cold: "
          f"{medians['flow cold, over SSH'] / medians['flow cold']:.2f}x (SSH's cost)")


if __name__ == "__main__":
    main()
