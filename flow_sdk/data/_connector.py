"""DataConnector and ShardedDataConnector: one handle on a dataset, read batch by batch."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from flow_sdk.data._errors import ColumnNotFoundError, DataSourceError, ShardingError
from flow_sdk.data._parquet import ParquetSource
from flow_sdk.data._pipeline import read_rows_for, rebatch
from flow_sdk.data._s3 import DEFAULT_READ_AHEAD
from flow_sdk.data._sharding import check_rank, rank_from_env
from flow_sdk.data._sources import Source, TableSource

if TYPE_CHECKING:
    import pandas as pd

    from flow_sdk.data._torch import ArrowTorchDataset

DEFAULT_BATCH_ROWS = 65_536

_C = TypeVar("_C", bound="DataConnector")


class DataConnector:
    """A dataset read as a stream of Arrow record batches, with torch and xgboost adapters.

    Create one with :meth:`from_parquet`, :meth:`from_arrow` or :meth:`from_pandas`. Reading
    is lazy: parquet data is decoded batch by batch when iterated, and :attr:`num_rows` comes
    from file metadata alone.
    """

    def __init__(self, source: Source) -> None:
        self._source = source

    @classmethod
    def from_parquet(
        cls: type[_C],
        path: str | os.PathLike[str],
        *,
        endpoint_url: str | None = None,
        read_ahead: int = DEFAULT_READ_AHEAD,
        s3_client: Any | None = None,
    ) -> _C:
        """A parquet file, a local directory of parquet files, or ``s3://bucket/prefix``.

        For S3 the prefix is listed once and only footers are fetched now; whole objects are
        fetched in parallel when read (at most ``read_ahead`` objects, and 256 MiB unless one
        object is larger, in flight or buffered).
        ``endpoint_url`` (or the ``AWS_ENDPOINT_URL`` env var) selects an S3-compatible
        server; ``s3_client`` is an optional boto3 S3 client to use instead of a new one.
        """
        if isinstance(path, str) and path.startswith("s3://"):
            return cls(
                ParquetSource.from_s3(
                    path, endpoint_url=endpoint_url, read_ahead=read_ahead, client=s3_client
                )
            )
        return cls(ParquetSource.from_local(path))

    @classmethod
    def from_arrow(cls: type[_C], table: pa.Table | pa.RecordBatch) -> _C:
        """An in-memory Arrow table (or record batch); no data is copied."""
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not isinstance(table, pa.Table):
            raise DataSourceError(
                f"from_arrow() takes a pyarrow.Table or RecordBatch, got {type(table).__name__}"
            )
        return cls(TableSource(table))

    @classmethod
    def from_pandas(cls: type[_C], df: pd.DataFrame, *, preserve_index: bool = False) -> _C:
        """A pandas DataFrame, converted to Arrow once (the index is dropped by default)."""
        return cls(TableSource(pa.Table.from_pandas(df, preserve_index=preserve_index)))

    @classmethod
    def from_dataframe(cls: type[_C], df: pd.DataFrame) -> _C:
        """Snowflake's name: a pandas DataFrame, as :meth:`from_pandas`. A Snowpark
        DataFrame has no meaning here: export its table to parquet and use
        :meth:`from_parquet`."""
        if not hasattr(df, "to_numpy") or not hasattr(df, "columns"):
            raise DataSourceError(
                f"from_dataframe() takes a pandas DataFrame, got {type(df).__name__}; for a "
                "Snowpark table, write it to parquet and use from_parquet()")
        return cls.from_pandas(df)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._source.describe()})"

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of every batch."""
        return self._source.schema

    @property
    def column_names(self) -> list[str]:
        """The column names, in schema order."""
        return list(self._source.schema.names)

    @property
    def num_rows(self) -> int:
        """Total rows, from parquet footers or table length; reads no data."""
        return self._source.num_rows

    @property
    def row_group_sizes(self) -> list[int]:
        """Rows in each unit (parquet row group, or 65,536-row block of an in-memory table)."""
        return [unit.num_rows for unit in self._source.units]

    def _select(self, columns: Sequence[str] | None) -> list[str] | None:
        if columns is None:
            return None
        if isinstance(columns, str):
            columns = [columns]
        names = set(self._source.schema.names)
        missing = [c for c in columns if c not in names]
        if missing:
            raise ColumnNotFoundError(
                f"column(s) {missing} not found; available: {self._source.schema.names}"
            )
        return list(columns)

    def iter_batches(
        self,
        batch_size: int = DEFAULT_BATCH_ROWS,
        *,
        columns: Sequence[str] | None = None,
        drop_last: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        """Yield ``pyarrow.RecordBatch`` es of exactly ``batch_size`` rows, in order.

        Only the last batch may be shorter (dropped with ``drop_last``). Values are as stored
        (no float32 cast); batches inside one parquet read are zero-copy slices.
        """
        return self._iter_batches(batch_size, columns, drop_last=drop_last, cast_float64=False)

    def _iter_batches(
        self,
        batch_size: int,
        columns: Sequence[str] | None,
        *,
        drop_last: bool,
        cast_float64: bool,
        read_rows: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        selected = self._select(columns)
        batches = self._source.read(
            self._source.units,
            selected,
            read_rows if read_rows is not None else read_rows_for(batch_size),
            cast_float64=cast_float64,
        )
        return rebatch(batches, batch_size, drop_last=drop_last)

    def to_arrow(self, columns: Sequence[str] | None = None) -> pa.Table:
        """Read everything into one Arrow table."""
        selected = self._select(columns)
        schema = (
            self._source.schema
            if selected is None
            else pa.schema([self._source.schema.field(name) for name in selected])
        )
        batches = self._source.read(self._source.units, selected, 1 << 20)
        return pa.Table.from_batches(list(batches), schema=schema)

    def to_pandas(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """Read everything into a pandas DataFrame (needs pandas)."""
        return self.to_arrow(columns).to_pandas()

    def to_torch_dataset(
        self,
        batch_size: int,
        shuffle: bool = False,
        seed: int | None = None,
        columns: Sequence[str] | None = None,
        cast_float64: bool = True,
        *,
        drop_last: bool = False,
        shuffle_buffer_rows: int | None = None,
        prefetch: int = 0,
        device: str | None = None,
    ) -> ArrowTorchDataset:
        """A ``torch.utils.data.IterableDataset`` yielding ``{column: tensor}`` per batch.

        Use it with ``DataLoader(ds, batch_size=None)``, since it already yields batches. See
        :class:`~flow_sdk.data._torch.ArrowTorchDataset` for shuffling, DataLoader workers,
        and memory sharing. Arrow always decodes a few read batches ahead on its own threads;
        ``prefetch=N`` also moves the Python side of batch making (numpy views, tensor
        slicing, shuffling) to a background thread, N read batches ahead. It is off by
        default: on a 2-core machine it made a small CPU training loop no faster, or slower
        with shuffling, the threads contending for the GIL and the cores. ``device="cuda"``
        hands out batches already on this process's GPU (pinned staging, copies on a side
        stream overlapping the next batch's decode; equal to the CPU batches bit for bit).
        """
        from flow_sdk.data._torch import make_torch_dataset

        return make_torch_dataset(
            self._source,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            columns=self._select(columns),
            cast_float64=cast_float64,
            drop_last=drop_last,
            shuffle_buffer_rows=shuffle_buffer_rows,
            prefetch=prefetch,
            device=device,
        )


class ShardedDataConnector(DataConnector):
    """A :class:`DataConnector` that splits into one disjoint shard per rank.

    Parquet sources split by row group, using row counts from the footers only: each rank gets
    one contiguous run of row groups, and the row counts of any two shards differ by at most
    the size of the largest row group. With fewer row groups than ranks some shards are empty
    (zero rows); rewrite the data with smaller row groups if every rank needs rows. In-memory
    sources split into even contiguous row ranges (sizes differ by at most one row).
    """

    @classmethod
    def from_connector(cls, connector: DataConnector) -> ShardedDataConnector:
        """Shard the data of an existing connector."""
        return cls(connector._source)

    def get_shard(self, rank: int | None = None, world_size: int | None = None) -> DataConnector:
        """This rank's shard as a :class:`DataConnector`.

        Without arguments, ``rank`` and ``world_size`` come from the ``RANK`` and
        ``WORLD_SIZE`` environment variables set for every worker of a running task.
        """
        if rank is None and world_size is None:
            rank, world_size = rank_from_env()
        elif rank is None or world_size is None:
            raise ShardingError("pass both rank and world_size to get_shard(), or neither")
        check_rank(rank, world_size)
        return DataConnector(self._source.shard(rank, world_size))

    def shard_row_counts(self, world_size: int) -> list[int]:
        """Rows in each of ``world_size`` shards, from metadata only."""
        check_rank(0, world_size)
        return [self._source.shard(rank, world_size).num_rows for rank in range(world_size)]
