"""Data for the trainer tests (import as ``trainers_helpers``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FEATURES = [f"f{i}" for i in range(6)]
LABEL = "y"


def regression_table(rows: int, seed: int) -> pa.Table:
    """Features (float64; two of them pure noise) and a smooth non-linear noisy target that
    boosted trees fit well: the held-out metric depends on the model, not on exactly where
    the bin edges fall (a jagged target makes it swing by several % between ``max_bin``
    values even in one process)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, len(FEATURES)))
    y = (2.0 * x[:, 0] + np.sin(x[:, 1]) + 0.5 * x[:, 2] - 0.5 * np.abs(x[:, 4])
         + 0.5 * rng.standard_normal(rows))
    return pa.table({**{name: x[:, i] for i, name in enumerate(FEATURES)}, LABEL: y})


def write_parquet(path: Path, table: pa.Table, row_group_size: int) -> Path:
    """``table`` as one parquet file with row groups of ``row_group_size`` rows."""
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def features_and_label(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` as float32 numpy arrays, the way the trainer hands batches to xgboost."""
    x = np.column_stack([table.column(c).to_numpy() for c in FEATURES]).astype(np.float32)
    return x, table.column(LABEL).to_numpy().astype(np.float32)
