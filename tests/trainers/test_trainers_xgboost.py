"""XGBEstimator on the local provider: real node agents, XGBoost's own collective between them.

The reference is single-process ``xgboost.train`` on the same rows with the same params (hist):
two workers each bin and sketch only their shard and all-reduce histograms, so their bins
differ slightly from one process's; the held-out metric must agree within 1 %.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import xgboost as xgb
from trainers_helpers import (
    FEATURES,
    LABEL,
    features_and_label,
    regression_table,
    write_parquet,
)

from flow_sdk.data import ShardedDataConnector
from flow_sdk.trainers import TrainerError
from flow_sdk.trainers.xgboost import XGBEstimator, XGBScalingConfig

pytestmark = pytest.mark.slow

TRAIN_ROWS, EVAL_ROWS, ROUNDS = 16_000, 4_000, 100
BASE: dict[str, Any] = {"tree_method": "hist", "max_depth": 3, "eta": 0.1, "max_bin": 128,
                        "seed": 0}
REGRESSION: dict[str, Any] = {**BASE, "objective": "reg:squarederror", "eval_metric": "rmse"}
CLASSIFICATION: dict[str, Any] = {**BASE, "objective": "binary:logistic", "eval_metric": "logloss"}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per objective: train/eval parquet files with several row groups, and the same rows
    as numpy (``binary:logistic`` gets a 0/1 label)."""
    root = tmp_path_factory.mktemp("xgb-data")
    table = regression_table(TRAIN_ROWS + EVAL_ROWS, seed=7)
    found: dict[str, Any] = {}
    for objective in ("reg:squarederror", "binary:logistic"):
        if objective == "binary:logistic":
            label = pc.cast(pc.greater(table.column(LABEL), 0), pa.float64())
            table = table.set_column(table.schema.get_field_index(LABEL), LABEL, label)
        train, held_out = table.slice(0, TRAIN_ROWS), table.slice(TRAIN_ROWS)
        name = objective.replace(":", "-")
        found[objective] = {
            "train": write_parquet(root / f"{name}-train.parquet", train, row_group_size=2_000),
            "eval": write_parquet(root / f"{name}-eval.parquet", held_out, row_group_size=500),
            "train_xy": features_and_label(train), "eval_xy": features_and_label(held_out)}
    return found


def _single_process(data: dict[str, Any], params: dict[str, Any]) -> float:
    """The held-out metric of single-process ``xgboost.train`` on the same rows."""
    (x, y), (ex, ey) = data["train_xy"], data["eval_xy"]
    dtrain = xgb.QuantileDMatrix(x, y, max_bin=params["max_bin"])
    deval = xgb.QuantileDMatrix(ex, ey, ref=dtrain, max_bin=params["max_bin"])
    result: dict[str, dict[str, list[float]]] = {}
    xgb.train({**params, "nthread": 1}, dtrain, ROUNDS, evals=[(deval, "valid")],
              evals_result=result, verbose_eval=False)
    value: float = result["valid"][params["eval_metric"]][-1]
    return value


def _connectors(data: dict[str, Any]) -> tuple[ShardedDataConnector, ShardedDataConnector]:
    return (ShardedDataConnector.from_parquet(data["train"]),
            ShardedDataConnector.from_parquet(data["eval"]))


@pytest.mark.parametrize("params", [REGRESSION, CLASSIFICATION], ids=["rmse", "logloss"])
def test_two_workers_reach_the_single_process_metric_within_1_percent(
        data: dict[str, Any], params: dict[str, Any]) -> None:
    data = data[params["objective"]]
    train, held_out = _connectors(data)
    estimator = XGBEstimator(params, ROUNDS, XGBScalingConfig(num_workers=2, num_cpu_per_worker=1))
    booster = estimator.fit(train, FEATURES, LABEL, eval_set=held_out)

    metric = params["eval_metric"]
    distributed = estimator.evals_result["valid"][metric][-1]
    single = _single_process(data, params)
    assert abs(distributed - single) / single < 0.01, (metric, distributed, single)
    assert len(estimator.evals_result["train"][metric]) == ROUNDS
    assert booster.num_boosted_rounds() == ROUNDS and estimator.get_booster() is booster
    # each worker read its own half of the row groups, through a QuantileDMatrix
    info = estimator.worker_info
    assert [w["rank"] for w in info] == [0, 1] and all(w["world_size"] == 2 for w in info)
    assert [w["train_rows"] for w in info] == [TRAIN_ROWS // 2] * 2
    assert [w["eval_rows"] for w in info] == [EVAL_ROWS // 2] * 2
    assert {w["matrix"] for w in info} == {"QuantileDMatrix"}
    # both workers saw the same (all-reduced) metric curve
    assert info[1]["evals_result"] == info[0]["evals_result"]

    # predict() runs here with the trained booster; its rmse is the recorded valid metric
    predictions = estimator.predict(held_out)
    ex, ey = data["eval_xy"]
    assert predictions.shape == (EVAL_ROWS,)
    expected = booster.predict(xgb.DMatrix(ex, feature_names=FEATURES))
    np.testing.assert_allclose(predictions, expected, rtol=1e-6)
    if metric == "rmse":
        assert np.sqrt(np.mean((predictions - ey) ** 2)) == pytest.approx(distributed, rel=1e-5)


def test_external_memory_trains_from_disk_pages_and_streams_the_eval_log(
        data: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    data = data[REGRESSION["objective"]]
    estimator = XGBEstimator(REGRESSION, ROUNDS, XGBScalingConfig(num_workers=2,
                                                                  num_cpu_per_worker=1),
                             external_memory=True, batch_size=1_000)
    train, held_out = _connectors(data)
    estimator.fit(train, FEATURES, LABEL, eval_set=held_out, verbose_eval=20)

    assert {w["matrix"] for w in estimator.worker_info} == {"ExtMemQuantileDMatrix"}
    distributed = estimator.evals_result["valid"]["rmse"][-1]
    single = _single_process(data, REGRESSION)
    assert abs(distributed - single) / single < 0.01, (distributed, single)
    printed = capsys.readouterr().out
    assert "[Node 0]" in printed and "valid-rmse" in printed  # rank 0's lines, streamed


def test_a_worker_error_reraises_here_with_its_type(data: dict[str, Any]) -> None:
    estimator = XGBEstimator({"objective": "no:such-objective"}, 5, XGBScalingConfig(2))
    with pytest.raises(xgb.core.XGBoostError, match="no:such-objective") as info:
        estimator.fit(_connectors(data["reg:squarederror"])[0], FEATURES, LABEL)
    assert info.value.__cause__ is not None  # the remote traceback
    with pytest.raises(TrainerError, match="fit\\(\\) first"):
        estimator.get_booster()
