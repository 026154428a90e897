"""Does the background prefetch thread of ``to_torch_dataset`` pay off? One run, side by side.

    python bench/prefetch.py

A small CPU training loop (24 -> 64 -> 1 MLP, SGD, batch 4096) over the parquet data of
bench/data.py, with ``prefetch=0`` (the default: Arrow's own read-ahead only) and
``prefetch=2`` (the Python side of batch making moved to a background thread), without and
with shuffling; rounds interleaved, best and median wall seconds per epoch. The figures, with
this command, are kept in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data import feature_names, generate, warm  # noqa: E402  (bench/data.py)

CASES = [(0, False), (2, False), (0, True), (2, True)]


def epoch(directory: Path, prefetch: int, shuffle: bool, batch_size: int, cols: int) -> float:
    import torch

    from flow_sdk.data import DataConnector

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(cols, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    names = feature_names(cols)
    dataset = DataConnector.from_parquet(directory).to_torch_dataset(
        batch_size, shuffle=shuffle, seed=1, prefetch=prefetch
    )
    start = time.perf_counter()
    for batch in dataset:
        features = torch.stack([batch[name] for name in names], dim=1)
        loss = ((model(features).squeeze(1) - batch["label"].float()) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=6_000_000)
    parser.add_argument("--cols", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=4_096)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--data", type=Path, help="reuse (or keep) the dataset in this dir")
    args = parser.parse_args()

    owned = args.data is None
    directory = Path(tempfile.mkdtemp(prefix="flow-bench-prefetch-")) if owned else args.data
    try:
        if not any(directory.glob("*.parquet")):
            directory.mkdir(parents=True, exist_ok=True)
            generate(directory, args.rows, args.cols, 3, 500_000, "random")
        times: dict[tuple[int, bool], list[float]] = {case: [] for case in CASES}
        for round_index in range(args.rounds):
            for prefetch, shuffle in CASES:
                warm(directory)
                seconds = epoch(directory, prefetch, shuffle, args.batch_size, args.cols)
                times[(prefetch, shuffle)].append(seconds)
                print(
                    f"  round {round_index + 1}/{args.rounds} prefetch={prefetch} "
                    f"shuffle={shuffle}: {seconds:.3f} s",
                    flush=True,
                )
        lines = [
            (
                f"Command: `{' '.join(['python bench/prefetch.py', *sys.argv[1:]])}`; "
                f"{args.rows:,} rows x {args.cols} features, batch {args.batch_size}, "
                f"{os.cpu_count()} cores, best and median of {args.rounds} interleaved epochs."
            ),
            "",
            (
                "| shuffle | prefetch=0 best / median s | prefetch=2 best / median s "
                "| prefetch=2 / prefetch=0 (best) |"
            ),
            "|---|---:|---:|---:|",
        ]
        for shuffle in (False, True):
            off, on = times[(0, shuffle)], times[(2, shuffle)]
            lines.append(
                f"| {shuffle} | {min(off):.3f} / {statistics.median(off):.3f} | "
                f"{min(on):.3f} / {statistics.median(on):.3f} | {min(on) / min(off):.2f} |"
            )
        print()
        print("\n".join(lines))
    finally:
        if owned:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
