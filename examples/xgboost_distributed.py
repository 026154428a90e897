"""Distributed XGBoost on local nodes, checked against single-process ``xgboost.train``.

Writes a synthetic regression dataset to parquet (several row groups, so every worker gets
its own run of them), trains it with ``XGBEstimator`` on ``--workers`` local nodes (XGBoost's
own collective, tracker on the leader, one ``QuantileDMatrix`` per worker built from its
shard's Arrow batches), then trains the same rows with the same params in this process, and
prints both held-out metrics side by side.

    python examples/xgboost_distributed.py [--workers 2] [--rows 100000] [--rounds 100]
                                           [--objective reg|binary] [--external-memory]

Exit code 0 when the distributed metric is within 1 % of the single-process one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FEATURES = [f"f{i}" for i in range(8)]


def write_dataset(folder: Path, rows: int, binary: bool, seed: int = 0) -> tuple[Path, Path]:
    """train.parquet (80 %) and eval.parquet (20 %), 16 and 8 row groups."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, len(FEATURES)))
    y = (2.0 * x[:, 0] + np.sin(x[:, 1]) + 0.5 * x[:, 2] - 0.5 * np.abs(x[:, 4])
         + 0.3 * x[:, 5] * x[:, 6] + 0.5 * rng.standard_normal(rows))
    if binary:
        y = (y > 0).astype(np.float64)
    table = pa.table({**{name: x[:, i] for i, name in enumerate(FEATURES)}, "label": y})
    cut = rows * 4 // 5
    train, held_out = folder / "train.parquet", folder / "eval.parquet"
    pq.write_table(table.slice(0, cut), train, row_group_size=max(1, cut // 16))
    pq.write_table(table.slice(cut), held_out, row_group_size=max(1, (rows - cut) // 8))
    return train, held_out


def single_process(train: Path, held_out: Path, params: dict[str, Any], rounds: int
                   ) -> tuple[float, float]:
    """(held-out metric, seconds) of plain ``xgboost.train`` on all the rows here."""
    import numpy as np
    import pyarrow.parquet as pq
    import xgboost as xgb

    def load(path: Path) -> tuple[Any, Any]:
        table = pq.read_table(path)
        x = np.column_stack([table.column(c).to_numpy() for c in FEATURES]).astype(np.float32)
        return x, table.column("label").to_numpy().astype(np.float32)

    started = time.perf_counter()
    (x, y), (ex, ey) = load(train), load(held_out)
    dtrain = xgb.QuantileDMatrix(x, y, max_bin=params["max_bin"])
    deval = xgb.QuantileDMatrix(ex, ey, ref=dtrain, max_bin=params["max_bin"])
    result: dict[str, dict[str, list[float]]] = {}
    xgb.train(params, dtrain, rounds, evals=[(deval, "valid")], evals_result=result,
              verbose_eval=False)
    return result["valid"][params["eval_metric"]][-1], time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="XGBoost threads per worker")
    parser.add_argument("--objective", choices=("reg", "binary"), default="reg")
    parser.add_argument("--external-memory", action="store_true")
    args = parser.parse_args(argv)

    from flow_sdk.data import ShardedDataConnector
    from flow_sdk.trainers.xgboost import XGBEstimator, XGBScalingConfig

    binary = args.objective == "binary"
    metric = "logloss" if binary else "rmse"
    params: dict[str, Any] = {"objective": "binary:logistic" if binary else "reg:squarederror",
              "eval_metric": metric, "tree_method": "hist",
              "max_depth": 4, "eta": 0.1, "max_bin": 256, "seed": 0}
    with tempfile.TemporaryDirectory(prefix="flow-xgb-example-") as folder:
        train, held_out = write_dataset(Path(folder), args.rows, binary)
        estimator = XGBEstimator(params, args.rounds,
                                 XGBScalingConfig(num_workers=args.workers,
                                                  num_cpu_per_worker=args.threads),
                                 external_memory=args.external_memory)
        started = time.perf_counter()
        estimator.fit(ShardedDataConnector.from_parquet(train), FEATURES, "label",
                      eval_set=ShardedDataConnector.from_parquet(held_out),
                      verbose_eval=max(1, args.rounds // 4))
        distributed_s = time.perf_counter() - started
        distributed = estimator.evals_result["valid"][metric][-1]
        single, single_s = single_process(train, held_out, {**params, "nthread": args.threads},
                                          args.rounds)
        predictions = estimator.predict(ShardedDataConnector.from_parquet(held_out))

    gap = abs(distributed - single) / single
    rows = [(f"XGBEstimator, {args.workers} workers"
             + (", external memory" if args.external_memory else ""), distributed, distributed_s),
            ("xgboost.train, 1 process", single, single_s)]
    # the distributed wall time includes starting the nodes and shipping the model back
    print(f"\n{args.rows} rows ({args.rows * 4 // 5} train), {len(FEATURES)} features, "
          f"{args.rounds} rounds, hist, max_bin={params['max_bin']}")
    print(f"{'run':<44} {'valid ' + metric:>12} {'wall s':>8}")
    for name, value, seconds in rows:
        print(f"{name:<44} {value:>12.6f} {seconds:>8.2f}")
    print(f"relative gap: {gap:.4%} (limit 1%); predict() on the eval set: "
          f"{len(predictions)} rows")
    for w in estimator.worker_info:
        print(f"  rank {w['rank']}: {w['train_rows']} train + {w['eval_rows']} eval rows, "
              f"{w['matrix']} built in {w['build_s']:.2f}s, trained in {w['train_s']:.2f}s")
    return 0 if gap < 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
