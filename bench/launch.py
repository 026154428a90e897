"""Launch latency: flow-sdk's local provider vs torchrun, on the same 2 x 2 gloo all-reduce.

    python bench/launch.py [--repeats 5]

Both sides start from nothing each round: ours measures ``.spawn()`` -> ``.result()``
(agents, rendezvous, workers, result back, nodes torn down); torchrun's measures two
``torchrun --nnodes=2 --nproc-per-node=2`` processes with a static rendezvous on loopback,
from start until both exit. Rounds alternate between the two so machine noise hits both.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _allreduce import allreduce_job  # noqa: E402

from flow_sdk import FlowApp  # noqa: E402

app = FlowApp("bench-launch")
flow_job = app.function(num_instances=2, workers_per_node=2)(allreduce_job)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def time_flow() -> float:
    start = time.perf_counter()
    result = flow_job.spawn().result(timeout=300)
    elapsed = time.perf_counter() - start
    assert result == 10.0, result
    return elapsed


def time_torchrun() -> float:
    port = free_port()
    script = str(Path(__file__).resolve().parent / "_allreduce.py")
    start = time.perf_counter()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
         f"--node-rank={node}", "--rdzv-backend=static", "--master-addr=127.0.0.1",
         f"--master-port={port}", script],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for node in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun failed: {err.decode()[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("FLOW_HOME", tempfile.mkdtemp(prefix="flow-bench-"))
    time_flow()  # warm the page cache for both (same interpreter, same torch)
    time_torchrun()
    ours, theirs = [], []
    for _ in range(args.repeats):
        ours.append(time_flow())
        theirs.append(time_torchrun())
    m_ours, m_theirs = statistics.median(ours), statistics.median(theirs)
    print(f"{'launcher':<34}{'median s':>10}{'min s':>9}{'max s':>9}")
    print(f"{'flow-sdk local (.spawn->.result)':<34}{m_ours:>10.2f}{min(ours):>9.2f}{max(ours):>9.2f}")
    print(f"{'torchrun x2, static rdzv':<34}{m_theirs:>10.2f}{min(theirs):>9.2f}{max(theirs):>9.2f}")
    print(f"ratio flow/torchrun (median): {m_ours / m_theirs:.2f}  (target <= 0.80)")


if __name__ == "__main__":
    main()
