"""Typed errors of the data connector. Each says what went wrong and what to do about it."""

from __future__ import annotations

from flow_sdk.errors import FlowError


class DataError(FlowError):
    """Base class of every error raised by :mod:`flow_sdk.data`."""


class DataSourceError(DataError):
    """A data source could not be found, listed, fetched or decoded."""


class SchemaMismatchError(DataSourceError):
    """The parquet files of one dataset do not share one schema."""


class ShardingError(DataError, ValueError):
    """A shard was asked for with an invalid or missing rank / world size."""


class UnsupportedColumnError(DataError, TypeError):
    """A column's Arrow type cannot be turned into a numeric array or tensor."""


class MissingDependencyError(DataError, ImportError):
    """An optional dependency needed for this call is not installed."""


class ColumnNotFoundError(DataError, LookupError):
    """A requested column is not in the dataset's schema."""
