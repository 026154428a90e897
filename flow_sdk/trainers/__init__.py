"""Distributed trainers built on the public ``FlowApp`` API (Snowflake-style).

* ``flow_sdk.trainers.xgboost``: ``XGBEstimator``, ``XGBScalingConfig`` -- XGBoost on
  ``num_workers`` nodes through XGBoost's own collective, each worker building a
  ``QuantileDMatrix`` from its shard of a ``DataConnector``.
* ``flow_sdk.trainers.pytorch``: ``PyTorchDistributor``, ``PyTorchScalingConfig``,
  ``WorkerResourceConfig``, ``get_context`` -- a training function on every worker of a
  ``num_nodes`` x ``num_workers_per_node`` task, its model saved on shared storage.

Importing this package imports neither torch nor xgboost (nor pyarrow): the names below are
loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from flow_sdk.trainers._common import TrainerError

if TYPE_CHECKING:
    from flow_sdk.trainers.pytorch import (
        PyTorchDistributor,
        PyTorchRunResponse,
        PyTorchScalingConfig,
        TrainingContext,
        WorkerResourceConfig,
        get_context,
    )
    from flow_sdk.trainers.xgboost import XGBEstimator, XGBScalingConfig

_LAZY = {
    "XGBEstimator": "xgboost",
    "XGBScalingConfig": "xgboost",
    "PyTorchDistributor": "pytorch",
    "PyTorchRunResponse": "pytorch",
    "PyTorchScalingConfig": "pytorch",
    "TrainingContext": "pytorch",
    "WorkerResourceConfig": "pytorch",
    "get_context": "pytorch",
}

__all__ = ["PyTorchDistributor", "PyTorchRunResponse", "PyTorchScalingConfig", "TrainerError",
           "TrainingContext", "WorkerResourceConfig", "XGBEstimator", "XGBScalingConfig",
           "get_context"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
