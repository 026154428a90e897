"""In-memory tables into torch batches: this tree against an earlier commit, in one run.

    python bench/table_batches.py [--base REF] [--rows 2000000] [--rounds 5]

The table of bench/gpu.py's part (b) (``batch_table``: 24 float64 features), read with
``DataConnector.from_arrow(table).to_torch_dataset(batch)`` on the CPU path and on the
``device="cpu"`` path (the CUDA path's staging code, without pinning or a GPU), the latter
also shuffled, at batches of 4,096, 65,536 and 262,144 rows. The SDK of ``--base`` (default
HEAD) is exported with ``git archive``; each round times both trees, each in a fresh child
process (warm-up pass first), in alternating order. Prints the best seconds per pass and
their ratio; the figures, with this command, are kept in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
FEATURES = 24
BATCHES = (4096, 65_536, 262_144)
PATHS = {"cpu path": (None, False), "device='cpu'": ("cpu", False),
         "device='cpu', shuffled": ("cpu", True)}  # name: (device, shuffle)


def batch_table(rows: int) -> pa.Table:
    """The in-memory table of this bench and of bench/gpu.py: FEATURES float64 columns."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(0)
    return pa.table({f"f{i}": rng.standard_normal(rows) for i in range(FEATURES)})


def measure(rows: int) -> dict[str, float]:
    """One timed pass per case, in this process, with the flow_sdk first on sys.path."""
    from flow_sdk.data import DataConnector

    connector = DataConnector.from_arrow(batch_table(rows))
    seconds = {}
    for batch in BATCHES:
        for name, (device, shuffle) in PATHS.items():
            for _ in range(2):  # a warm-up pass, then the timed one
                started = time.perf_counter()
                got = sum(len(next(iter(b.values()))) for b in connector.to_torch_dataset(
                    batch, device=device, shuffle=shuffle, seed=0))
                assert got == rows, (name, batch, got)
            seconds[f"{batch} {name}"] = time.perf_counter() - started
    return seconds


def child(sdk_root: Path, rows: int) -> dict[str, float]:
    code = (f"import json, sys; sys.path.insert(0, {str(sdk_root)!r}); "
            f"sys.path.insert(1, {str(ROOT / 'bench')!r}); import flow_sdk, table_batches; "
            f"assert flow_sdk.__file__.startswith({str(sdk_root)!r}), flow_sdk.__file__; "
            f"print(json.dumps(table_batches.measure({rows})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=sdk_root)
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="HEAD", help="the commit to compare against")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    base_rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="flow-bench-base-") as tmp:
        archive = subprocess.run(["git", "archive", args.base, "flow_sdk"], cwd=ROOT,
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        trees = {f"base {base_rev}": Path(tmp), "this tree": ROOT}
        best: dict[str, dict[str, float]] = {name: {} for name in trees}
        for round_ in range(args.rounds):
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for name in order:
                for case, seconds in child(trees[name], args.rows).items():
                    best[name][case] = min(seconds, best[name].get(case, float("inf")))
    base, ours = best.values()
    print(f"Command: python bench/table_batches.py --base {args.base} --rows {args.rows} "
          f"--rounds {args.rounds}\n")
    print(f"| batch, path | base {base_rev} s | this tree s | speed-up |\n|---|---:|---:|---:|")
    for case in base:
        print(f"| {case} | {base[case]:.4f} | {ours[case]:.4f} | {base[case] / ours[case]:.2f}x |")


if __name__ == "__main__":
    main()
