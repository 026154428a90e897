"""Where the time of bench/gpu.py's batch paths goes (needs a CUDA GPU; exits 2 without one).

    python bench/gpu_costs.py [--rows 2000000]

On the table of bench/gpu.py's part (b), best of 3 passes each, with the minor page faults of
the last pass:
- per batch size: the CPU path alone, ``device="cpu"``, ours (``device="cuda"``), naive and
  the pinned-copy ceiling of bench/gpu.py;
- the pieces of one 65,536-row batch of 24 columns, 31 times (about the whole table): the
  float64 -> float32 cast into fresh memory, the same cast into reused pinned buffers (the
  least any float32 path from float64 data must do), pageable and pinned copies to the GPU,
  and 72 pinned allocations;
- a cProfile of one pass of ours at 65,536 and at 4,096 rows, by own time.
Prints the figures; the ones quoted in bench/RESULTS.md came from these measurements.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gpu import ceiling, drain, naive  # bench/gpu.py, which puts this checkout on sys.path
from table_batches import FEATURES, batch_table  # bench/table_batches.py

from flow_sdk.data import DataConnector

BATCH = 65_536
TIMES = 31  # batches of BATCH rows in the default table


def best(fn: Callable[[], Any], passes: int = 3) -> str:
    seconds, faults = float("inf"), 0
    for _ in range(passes):
        torch.cuda.synchronize()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        seconds = min(seconds, time.perf_counter() - started)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return f"{seconds:.4f} s, {faults} faults"


def paths(connector: DataConnector, rows: int) -> None:
    def cpu_path(size: int) -> int:
        return sum(len(next(iter(b.values()))) for b in connector.to_torch_dataset(size))

    for size in (4096, BATCH, 262_144):
        print(f"| {size} | CPU path | {best(lambda: cpu_path(size))} |")
        print(f"| {size} | device='cpu' | "
              f"{best(lambda: drain(connector.to_torch_dataset(size, device='cpu')))} |")
        print(f"| {size} | ours | "
              f"{best(lambda: drain(connector.to_torch_dataset(size, device='cuda')))} |")
        print(f"| {size} | naive | {best(lambda: naive(connector, size))} |")
        print(f"| {size} | ceiling | {best(lambda: ceiling(rows, size))} |")


def pieces(connector: DataConnector) -> None:
    table = connector.to_arrow()
    x64 = [table.column(i).to_numpy()[:BATCH] for i in range(FEATURES)]
    pinned = [torch.empty(BATCH, pin_memory=True) for _ in range(FEATURES)]
    pageable = [torch.from_numpy(a.astype(np.float32)) for a in x64]

    def cast_into_pinned() -> None:
        for buffer, values in zip(pinned, x64):
            np.copyto(buffer.numpy(), values, casting="same_kind")

    steps: dict[str, Callable[[], Any]] = {
        "cast into fresh memory": lambda: [a.astype(np.float32) for a in x64],
        "cast into reused pinned buffers": cast_into_pinned,
        "pageable .to('cuda')": lambda: [p.to("cuda") for p in pageable],
        "pinned .to('cuda', non_blocking=True)":
            lambda: [p.to("cuda", non_blocking=True) for p in pinned],
    }
    for name, step in steps.items():
        print(f"| {name}, x{TIMES} | {best(lambda: [step() for _ in range(TIMES)])} |")
    started = time.perf_counter()
    [torch.empty(BATCH, pin_memory=True) for _ in range(72)]
    print(f"| 72 pinned allocations | {time.perf_counter() - started:.4f} s |")


def profiles(connector: DataConnector) -> None:
    for size in (BATCH, 4096):
        profile = cProfile.Profile()
        profile.enable()
        drain(connector.to_torch_dataset(size, device="cuda"))
        profile.disable()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(14)
        print(f"\nours at {size} rows, by own time:\n{out.getvalue()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu_costs.py needs a CUDA GPU: torch.cuda.is_available() is False here",
              file=sys.stderr)
        raise SystemExit(2)
    print(f"Command: python bench/gpu_costs.py --rows {args.rows}\n")
    connector = DataConnector.from_arrow(batch_table(args.rows))
    print("| batch | path | best of 3 |\n|---:|---|---|")
    paths(connector, args.rows)
    print("\n| piece | best of 3 |\n|---|---|")
    pieces(connector)
    profiles(connector)


if __name__ == "__main__":
    main()
