"""The xgboost adapter: DataIter -> QuantileDMatrix / ExtMemQuantileDMatrix, same model quality."""

from __future__ import annotations

import gc
import tempfile
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xgboost as xgb

from flow_sdk.data import (
    ColumnNotFoundError,
    DataConnector,
    UnsupportedColumnError,
    build_quantile_dmatrix,
    make_data_iter,
)

FEATURES = [f"f{j}" for j in range(6)]
PARAMS = {"objective": "reg:squarederror", "max_depth": 4, "eta": 0.3, "nthread": 2, "seed": 0}


def regression_data(rows: int = 12_000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    features = rng.standard_normal((rows, len(FEATURES)))
    label = features[:, 0] + 0.5 * features[:, 1] ** 2 - features[:, 2] * features[:, 3]
    return features, label + 0.1 * rng.standard_normal(rows)


def rmse(booster: xgb.Booster, features: np.ndarray, label: np.ndarray) -> float:
    predictions = booster.predict(xgb.DMatrix(features, feature_names=FEATURES))
    return float(np.sqrt(np.mean((predictions - label) ** 2)))


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[DataConnector, np.ndarray, np.ndarray]:
    features, label = regression_data()
    table = pa.table({**{name: features[:, j] for j, name in enumerate(FEATURES)}, "y": label})
    pq.write_table(table, tmp_path / "train.parquet", row_group_size=2_500)
    return DataConnector.from_parquet(tmp_path / "train.parquet"), features, label


def test_quantile_dmatrix_matches_numpy_built_one(
    dataset: tuple[DataConnector, np.ndarray, np.ndarray],
) -> None:
    connector, features, label = dataset
    matrix = build_quantile_dmatrix(connector, FEATURES, "y", batch_size=3_000, max_bin=64)
    assert isinstance(matrix, xgb.QuantileDMatrix)
    assert (matrix.num_row(), matrix.num_col()) == (len(label), len(FEATURES))
    assert matrix.feature_names == FEATURES
    assert np.allclose(matrix.get_label(), label.astype(np.float32))
    reference = xgb.QuantileDMatrix(
        features.astype(np.float32), label=label, feature_names=FEATURES, max_bin=64
    )
    params = {**PARAMS, "max_bin": 64}
    ours = xgb.train(params, matrix, num_boost_round=40)
    theirs = xgb.train(params, reference, num_boost_round=40)
    ours_rmse, theirs_rmse = rmse(ours, features, label), rmse(theirs, features, label)
    assert ours_rmse == pytest.approx(theirs_rmse, rel=0.02)
    assert ours_rmse < 0.5 * float(np.std(label))


def test_external_memory_matrix_uses_the_cache_dir(
    dataset: tuple[DataConnector, np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    connector, features, label = dataset
    cache = tmp_path / "xgb-cache"
    matrix = build_quantile_dmatrix(
        connector, FEATURES, "y", external_memory=True, batch_size=4_000, cache_dir=cache
    )
    assert isinstance(matrix, xgb.ExtMemQuantileDMatrix)
    assert (matrix.num_row(), matrix.num_col()) == (len(label), len(FEATURES))
    assert any(cache.iterdir()), "xgboost wrote its page cache under cache_dir"
    booster = xgb.train(PARAMS, matrix, num_boost_round=20)
    assert rmse(booster, features, label) < 0.6 * float(np.std(label))


def test_external_memory_default_cache_is_temporary(
    dataset: tuple[DataConnector, np.ndarray, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connector, _, label = dataset
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    matrix = build_quantile_dmatrix(connector, FEATURES, "y", external_memory=True)
    assert matrix.num_row() == len(label)
    (cache,) = scratch.iterdir()
    assert cache.name.startswith("flow-xgb-cache-") and any(cache.iterdir())
    xgb.train(PARAMS, matrix, num_boost_round=2)
    del matrix
    gc.collect()
    assert not cache.exists()


def test_validation_matrix_uses_the_training_bins(
    dataset: tuple[DataConnector, np.ndarray, np.ndarray],
) -> None:
    connector, features, label = dataset
    train = build_quantile_dmatrix(connector, FEATURES, "y")
    valid_connector = DataConnector.from_arrow(
        pa.table({**{n: features[:500, j] for j, n in enumerate(FEATURES)}, "y": label[:500]})
    )
    valid = build_quantile_dmatrix(valid_connector, FEATURES, "y", ref=train)
    history: dict[str, dict[str, list[float]]] = {}
    xgb.train(PARAMS, train, 5, evals=[(valid, "valid")], evals_result=history)
    assert len(history["valid"]["rmse"]) == 5


def test_data_iter_streams_float32_batches_and_is_released() -> None:
    features, label = regression_data(1_000)
    table = pa.table(
        {
            **{n: features[:, j] for j, n in enumerate(FEATURES)},
            "y": pa.array(label.astype(np.int64)),
            "w": pa.array(np.ones(len(label))),
        }
    )
    connector = DataConnector.from_arrow(table)
    iterator: Any = make_data_iter(connector, FEATURES, "y", batch_size=300, weight_col="w")
    seen: list[tuple[np.ndarray, np.ndarray]] = []

    def capture(**kwargs: object) -> None:
        data, y = kwargs["data"], kwargs["label"]
        assert isinstance(data, np.ndarray) and isinstance(y, np.ndarray)
        assert data.dtype == np.float32 and y.dtype == np.float32 and data.flags.c_contiguous
        assert kwargs["feature_names"] == FEATURES
        seen.append((data, y))

    while iterator.next(capture):
        pass
    assert [len(y) for _, y in seen] == [300, 300, 300, 100]
    assert np.allclose(np.vstack([d for d, _ in seen]), features.astype(np.float32))
    matrix = xgb.QuantileDMatrix(iterator)
    assert matrix.num_row() == 1_000 and np.allclose(matrix.get_weight(), 1.0)
    # build_quantile_dmatrix drops the iterator (and with it the connector) before returning.
    watcher = weakref.ref(connector)
    built = build_quantile_dmatrix(connector, FEATURES, "y")
    iterator.close()
    del connector, iterator
    gc.collect()
    assert watcher() is None and built.num_row() == 1_000


def test_nulls_are_missing_values() -> None:
    table = pa.table({"a": [1.0, None, 3.0, 4.0], "b": [1, 2, None, 4], "y": [0.0, 1.0, 0.0, 1.0]})
    matrix = build_quantile_dmatrix(DataConnector.from_arrow(table), ["a", "b"], "y")
    dense = xgb.DMatrix(np.array([[1, 1], [np.nan, 2], [3, np.nan], [4, 4]], dtype=np.float32))
    assert matrix.num_row() == 4 and matrix.num_nonmissing() == dense.num_nonmissing() == 6


def test_bad_columns_are_rejected_before_reading() -> None:
    connector = DataConnector.from_arrow(pa.table({"a": [1.0], "s": ["x"], "y": [1.0]}))
    with pytest.raises(ColumnNotFoundError, match="missing"):
        build_quantile_dmatrix(connector, ["a", "missing"], "y")
    with pytest.raises(UnsupportedColumnError, match="'s'"):
        build_quantile_dmatrix(connector, ["a", "s"], "y")
    with pytest.raises(ValueError):
        build_quantile_dmatrix(connector, [], "y")
