"""The Slurm provider against submitit, side by side in one run on one real Slurm cluster.

    pip install submitit   # the baseline; not a dependency of the SDK
    python bench/slurm.py [--repeats 7]

A 3-node cluster starts on this machine (``tests/slurm_cluster.py``: munged, slurmctld and
three slurmd on loopback addresses). Both sides run the same trivial function on 2 nodes, one
task per node, and wait for every rank's result: ``.remote()`` on ``provider="slurm"`` (a new
job on idle nodes), and submitit's ``executor.submit(fn).results()`` with the same shape.
The first flow run builds the node environment for this SDK's digest and is reported on its
own ("first"); the rounds after it alternate the two sides. Target: flow's cold median at most
1.0x submitit's.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from slurm_cluster import SlurmCluster  # noqa: E402


def rank_of() -> int:
    return int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    import submitit

    logging.getLogger("submitit").setLevel(logging.ERROR)  # it warns at every sacct it tries
    from flow_sdk import FlowApp

    work = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    cluster = SlurmCluster.start(work / "cluster", nodes=3, subnet=150)
    os.environ["SLURM_CONF"] = str(cluster.conf)
    os.environ["FLOW_HOME"] = str(work / "flow-home")
    try:
        app = FlowApp("bench-slurm", provider="slurm",
                      provider_config={"shared_dir": str(work / "shared")})
        flow_fn = app.function(num_instances=2, max_run_time_hours=0.1, quiet=True)(rank_of)
        executor = submitit.AutoExecutor(folder=str(work / "submitit"), cluster="slurm")
        executor.update_parameters(nodes=2, tasks_per_node=1, timeout_min=10,
                                   slurm_partition=cluster.partition)

        def flow_once() -> float:
            start = time.perf_counter()
            assert flow_fn.remote() == 0
            return time.perf_counter() - start

        def submitit_once() -> float:
            start = time.perf_counter()
            assert sorted(executor.submit(rank_of).results()) == [0, 1]
            return time.perf_counter() - start

        first = flow_once()
        submitit_once()  # its first job, for the page cache
        times: dict[str, list[float]] = {"flow": [], "submitit": []}
        for _ in range(args.repeats):
            times["flow"].append(flow_once())
            times["submitit"].append(submitit_once())
        report(first, times)
    finally:
        cluster.stop()


def report(first: float, times: dict[str, list[float]]) -> None:
    medians: dict[str, Any] = {side: statistics.median(values) for side, values in times.items()}
    print(f"flow first run (builds the node environment): {first:.2f} s")
    for side, values in times.items():
        print(f"{side:9s} median {medians[side]:.2f} s over {len(values)} runs "
              f"({', '.join(f'{v:.2f}' for v in values)})")
    ratio = medians["flow"] / medians["submitit"]
    print(f"flow / submitit (cold, 2 nodes): {ratio:.2f}x (target at most 1.0x)")


if __name__ == "__main__":
    main()
