"""A 2-worker local XGBoost fit: every worker using all cores vs. its share, in one run.

    python bench/xgb_threads.py [--rows 400000] [--rounds 40] [--repeats 3]

Both variants train the same data with the same parameters on 2 local nodes of 1 worker each:
  all_cores  what workers did before they got a share of the machine: OMP_NUM_THREADS (and
             with it XGBoost's nthread) set to every core of the machine in each worker
  share      the default now: each worker's nthread is its share (cores // 2 on one machine)
Rounds alternate between the variants. Reported: the slower worker's train time (matrix
build and boosting, inside the workers), the whole fit's wall time, and the final train
RMSE of each (the same model quality is the point: only the threading differs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from flow_sdk.data import DataConnector  # noqa: E402
from flow_sdk.trainers import XGBEstimator, XGBScalingConfig  # noqa: E402

TARGET = 1.5
PARAMS = {"objective": "reg:squarederror", "tree_method": "hist", "max_depth": 6, "eta": 0.1,
          "seed": 0}


def write_data(folder: Path, rows: int, features: int) -> list[str]:
    """Two parquet files (one per worker) of a noisy linear target with interactions."""
    rng = np.random.default_rng(0)
    cols = [f"f{i}" for i in range(features)]
    for part in range(2):
        x = rng.standard_normal((rows // 2, features)).astype(np.float32)
        y = x[:, 0] * x[:, 1] + x @ rng.standard_normal(features) + 0.1 * rng.standard_normal(
            rows // 2)
        table = pa.table({**{c: x[:, i] for i, c in enumerate(cols)}, "label": y})
        pq.write_table(table, folder / f"part-{part}.parquet", row_group_size=rows // 8)
    return cols


def fit(data: DataConnector, cols: list[str], rounds: int, all_cores: bool
        ) -> dict[str, float]:
    env = {"OMP_NUM_THREADS": str(len(os.sched_getaffinity(0)))} if all_cores else {}
    estimator = XGBEstimator(PARAMS, num_boost_round=rounds,
                             scaling_config=XGBScalingConfig(num_workers=2),
                             provider_config={"ssh": False},
                             function_options={"environment": env})
    started = time.perf_counter()
    estimator.fit(data, cols, "label")
    wall = time.perf_counter() - started
    info: list[dict[str, Any]] = estimator.worker_info
    return {"wall_s": wall,
            "train_s": max(w["build_s"] + w["train_s"] for w in info),
            "rmse": estimator.evals_result["train"]["rmse"][-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--features", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    runs: dict[str, list[dict[str, float]]] = {"all_cores": [], "share": []}
    with tempfile.TemporaryDirectory(prefix="flow-bench-xgb-") as tmp:
        cols = write_data(Path(tmp), args.rows, args.features)
        data = DataConnector.from_parquet(tmp)
        for _ in range(args.repeats):
            for name in runs:
                runs[name].append(fit(data, cols, args.rounds, name == "all_cores"))
    print(f"Command: python bench/xgb_threads.py --rows {args.rows} --rounds {args.rounds} "
          f"--repeats {args.repeats}")
    print(f"Machine: {cores} cores, load average at end {os.getloadavg()[0]:.2f}; 2 local "
          f"nodes x 1 XGBoost worker, {args.rows:,} rows x {args.features} features\n")
    print("| threads per worker | median train s (slower worker) | median fit wall s | "
          "train s, each run | final train RMSE |")
    print("|---|---:|---:|---|---:|")
    medians = {}
    for name, results in runs.items():
        threads = cores if name == "all_cores" else max(1, cores // 2)
        medians[name] = statistics.median(r["train_s"] for r in results)
        each = ", ".join(f"{r['train_s']:.2f}" for r in results)
        rmse = {round(r["rmse"], 6) for r in results}
        print(f"| {name} ({threads}) | {medians[name]:.2f} | "
              f"{statistics.median(r['wall_s'] for r in results):.2f} | {each} | "
              f"{', '.join(map(str, sorted(rmse)))} |")
    ratio = medians["all_cores"] / medians["share"]
    verdict = "met" if ratio >= TARGET else "MISSED"
    print(f"\nshare vs all cores, train time: {ratio:.2f}x faster (target >= {TARGET}x): {verdict}")


if __name__ == "__main__":
    main()
