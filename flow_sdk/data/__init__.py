"""Sharded Arrow data for training: parquet (local or S3) and in-memory tables.

``DataConnector`` reads a dataset batch by batch; ``ShardedDataConnector.get_shard()`` gives
each rank of a task its disjoint, balanced part. Adapters turn batches into torch tensors
(``to_torch_dataset``) and xgboost matrices (``build_quantile_dmatrix``) on a lean memory
path: float64 becomes float32 per batch, and numeric columns are zero-copy where possible.

pyarrow and numpy are required; torch, xgboost and boto3 are imported only when used.
"""

from __future__ import annotations

from flow_sdk.data._connector import DataConnector, ShardedDataConnector
from flow_sdk.data._convert import column_to_numpy
from flow_sdk.data._errors import (
    ColumnNotFoundError,
    DataError,
    DataSourceError,
    MissingDependencyError,
    SchemaMismatchError,
    ShardingError,
    UnsupportedColumnError,
)
from flow_sdk.data._s3 import S3Object, S3Reader, S3ReadStats, iter_s3_objects
from flow_sdk.data._xgboost import build_quantile_dmatrix, default_nthread, make_data_iter

__all__ = [
    "ColumnNotFoundError",
    "DataConnector",
    "DataError",
    "DataSourceError",
    "MissingDependencyError",
    "S3Object",
    "S3ReadStats",
    "S3Reader",
    "SchemaMismatchError",
    "ShardedDataConnector",
    "ShardingError",
    "UnsupportedColumnError",
    "build_quantile_dmatrix",
    "column_to_numpy",
    "default_nthread",
    "iter_s3_objects",
    "make_data_iter",
]
