"""Where rows come from: the unit model every source shares, and in-memory Arrow tables.

A source is a list of *units*, each with a row count known without reading data: a parquet row
group (counts from the file footers, see :mod:`flow_sdk.data._parquet`), or a block of rows of
an in-memory table. Sharding, shuffling and DataLoader-worker splitting all work on units.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from flow_sdk.data._sharding import assign_row_groups, even_row_ranges

TABLE_UNIT_ROWS = 65_536

@dataclass(frozen=True)
class Unit:
    """A piece of a source with a known row count.

    ``part`` is the file index (0 for tables); ``index`` is the row-group index within the file,
    or the first row of the block for tables.
    """

    part: int
    index: int
    num_rows: int


class Source(ABC):
    """Rows split into units; readable in any unit order."""

    schema: pa.Schema
    units: tuple[Unit, ...]

    @property
    def num_rows(self) -> int:
        return sum(unit.num_rows for unit in self.units)

    @abstractmethod
    def read(
        self,
        units: Sequence[Unit],
        columns: list[str] | None,
        batch_rows: int,
        *,
        cast_float64: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        """Yield record batches of at most ``batch_rows`` rows covering ``units`` in order.

        With ``cast_float64`` a source may already cast float64 (and decimal) columns to
        float32 while decoding; callers still run :func:`convert_column`, which casts what is
        left.
        """

    @abstractmethod
    def subset(self, units: Sequence[Unit]) -> Source:
        """The same data restricted to ``units`` (kept in the given order)."""

    @abstractmethod
    def shard(self, rank: int, world_size: int) -> Source:
        """This rank's disjoint, balanced part of the source."""

    @abstractmethod
    def describe(self) -> str:
        """A short human-readable description, for reprs and error messages."""


class TableSource(Source):
    """An in-memory Arrow table; units are blocks of up to 65,536 rows.

    Shards are even contiguous row ranges (zero-copy slices of the table).
    """

    def __init__(self, table: pa.Table, units: Sequence[Unit] | None = None) -> None:
        self.table = table
        self.schema = table.schema
        if units is None:
            units = [
                Unit(0, start, min(TABLE_UNIT_ROWS, table.num_rows - start))
                for start in range(0, table.num_rows, TABLE_UNIT_ROWS)
            ]
        self.units = tuple(units)

    def read(
        self,
        units: Sequence[Unit],
        columns: list[str] | None,
        batch_rows: int,
        *,
        cast_float64: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        table = self.table if columns is None else self.table.select(columns)
        for start, rows in _contiguous_runs(units):
            yield from table.slice(start, rows).to_batches(max_chunksize=batch_rows)

    def subset(self, units: Sequence[Unit]) -> TableSource:
        return TableSource(self.table, units)

    def shard(self, rank: int, world_size: int) -> TableSource:
        if self._is_whole_table():
            start, stop = even_row_ranges(self.num_rows, world_size)[rank]
            return TableSource(self.table.slice(start, stop - start))
        assignment = assign_row_groups([u.num_rows for u in self.units], world_size)
        return self.subset([self.units[i] for i in assignment[rank]])

    def _is_whole_table(self) -> bool:
        expected = 0
        for unit in self.units:
            if unit.index != expected:
                return False
            expected += unit.num_rows
        return expected == int(self.table.num_rows)

    def describe(self) -> str:
        return f"in-memory table ({self.num_rows} rows)"


def _contiguous_runs(units: Sequence[Unit]) -> Iterator[tuple[int, int]]:
    """(first row, rows) of each run of blocks that follow each other in the table, in order.
    A run is read as one slice, so a batch that spans two blocks is a view of the table
    rather than a concatenation of two reads."""
    start = rows = 0
    for unit in units:
        if rows and unit.index == start + rows:
            rows += unit.num_rows
            continue
        if rows:
            yield start, rows
        start, rows = unit.index, unit.num_rows
    if rows:
        yield start, rows
