"""Parquet sources: files on local disk or objects on S3, whose units are row groups.

Row counts come from the file footers (fetched with ranged GETs on S3); row groups are then
scanned one at a time through small buffers, optionally casting float64 to float32 on decode.
"""

from __future__ import annotations

import functools
import itertools
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from flow_sdk.data._errors import DataSourceError, SchemaMismatchError
from flow_sdk.data._s3 import DEFAULT_READ_AHEAD, S3Object, S3Reader
from flow_sdk.data._sharding import assign_row_groups
from flow_sdk.data._sources import Source, Unit

if TYPE_CHECKING:
    import pyarrow.dataset as pds

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
_FOOTER_TAIL_BYTES = 64 * 1024
_BATCH_READAHEAD = 4


@functools.cache
def _parquet_format() -> pds.ParquetFileFormat:
    # pyarrow.dataset imports pandas (~0.3 s), so it is loaded on first read only.
    import pyarrow.dataset as pds

    return pds.ParquetFileFormat()

@dataclass(frozen=True)
class ParquetFileInfo:
    """One parquet file: where it is, its size, and the row count of each row group."""

    location: str
    size: int
    row_groups: tuple[int, ...]


def _row_groups(metadata: pq.FileMetaData) -> tuple[int, ...]:
    return tuple(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))


def _check_schemas(files: Sequence[ParquetFileInfo], schemas: Sequence[pa.Schema]) -> pa.Schema:
    first = schemas[0]
    for info, schema in zip(files[1:], schemas[1:], strict=True):
        same: bool = schema.equals(first, check_metadata=False)
        if not same:
            raise SchemaMismatchError(
                f"{info.location} has schema {schema.to_string(show_schema_metadata=False)!r} "
                f"but {files[0].location} has {first.to_string(show_schema_metadata=False)!r}; "
                "every file of one dataset must have the same columns and types"
            )
    return first


def _is_data_file(name: str) -> bool:
    return not name.startswith(("_", ".")) and name.lower().endswith(PARQUET_SUFFIXES)


def _local_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DataSourceError(f"{path} does not exist; pass a parquet file or a directory of them")
    found: list[Path] = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        found.extend(Path(root) / name for name in sorted(names) if _is_data_file(name))
    if not found:
        raise DataSourceError(
            f"no parquet files ({', '.join(PARQUET_SUFFIXES)}) found under {path}"
        )
    return found


class ParquetSource(Source):
    """Parquet files, local or on S3; units are row groups.

    Local files are opened when read. S3 objects are listed once when the source is created,
    their footers are fetched with one ranged GET each (two if the footer is larger than
    64 KiB), and whole objects are fetched when their row groups are read, through the
    reader's bounded read-ahead. Hive partition directories are not turned into columns.
    """

    def __init__(
        self,
        files: Sequence[ParquetFileInfo],
        schema: pa.Schema,
        units: Sequence[Unit] | None = None,
        *,
        s3_uri: str | None = None,
        endpoint_url: str | None = None,
        read_ahead: int = DEFAULT_READ_AHEAD,
    ) -> None:
        self.files = tuple(files)
        self.schema = schema
        if units is None:
            units = [
                Unit(part, index, rows)
                for part, info in enumerate(self.files)
                for index, rows in enumerate(info.row_groups)
            ]
        self.units = tuple(units)
        self.s3_uri = s3_uri
        self.endpoint_url = endpoint_url
        self.read_ahead = read_ahead
        self._reader: S3Reader | None = None

    @classmethod
    def from_local(cls, path: str | os.PathLike[str]) -> ParquetSource:
        files: list[ParquetFileInfo] = []
        schemas: list[pa.Schema] = []
        for file in _local_files(Path(path).resolve()):  # nodes run in other directories
            try:
                metadata = pq.read_metadata(file)
            except (OSError, pa.ArrowException) as exc:
                raise DataSourceError(f"{file} is not a readable parquet file: {exc}") from exc
            files.append(ParquetFileInfo(str(file), file.stat().st_size, _row_groups(metadata)))
            schemas.append(metadata.schema.to_arrow_schema())
        return cls(files, _check_schemas(files, schemas))

    @classmethod
    def from_s3(
        cls,
        uri: str,
        *,
        endpoint_url: str | None = None,
        read_ahead: int = DEFAULT_READ_AHEAD,
        client: Any | None = None,
    ) -> ParquetSource:
        reader = S3Reader(uri, endpoint_url=endpoint_url, read_ahead=read_ahead, client=client)
        prefix = reader.prefix
        objects = [
            obj
            for obj in reader.list_objects()
            if obj.key == prefix
            or (
                (not prefix or prefix.endswith("/") or obj.key.startswith(prefix + "/"))
                and _is_data_file(obj.key.rsplit("/", 1)[-1])
            )
        ]
        if not objects:
            raise DataSourceError(f"no parquet objects found under {uri}")
        files: list[ParquetFileInfo] = []
        schemas: list[pa.Schema] = []
        for obj, tail in reader.iter_tails(objects, _FOOTER_TAIL_BYTES):
            metadata = _footer_metadata(reader, obj, tail)
            files.append(ParquetFileInfo(obj.key, obj.size, _row_groups(metadata)))
            schemas.append(metadata.schema.to_arrow_schema())
        result = cls(
            files,
            _check_schemas(files, schemas),
            s3_uri=uri,
            endpoint_url=endpoint_url,
            read_ahead=read_ahead,
        )
        result._reader = reader
        return result

    def _s3_reader(self) -> S3Reader:
        if self._reader is not None and self._reader.pid != os.getpid():
            # A forked process (e.g. a DataLoader worker) inherits the parent's reader, but not
            # its fetch threads; its sockets are the parent's. Start a fresh one here.
            self._reader.abandon()
            self._reader = None
        if self._reader is None:
            if self.s3_uri is None:
                raise DataSourceError("this parquet source is not on S3")
            self._reader = S3Reader(
                self.s3_uri, endpoint_url=self.endpoint_url, read_ahead=self.read_ahead
            )
        return self._reader

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None  # sockets and threads stay in this process
        return state

    def read(
        self,
        units: Sequence[Unit],
        columns: list[str] | None,
        batch_rows: int,
        *,
        cast_float64: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        projection = _projection(self.schema, columns, cast_float64)
        groups = [
            (part, [unit.index for unit in run])
            for part, run in itertools.groupby(units, key=lambda unit: unit.part)
        ]
        if self.s3_uri is None:
            local = pafs.LocalFileSystem()
            for part, row_groups in groups:
                location = self.files[part].location
                try:
                    fragment = _parquet_format().make_fragment(location, filesystem=local)
                except (OSError, pa.ArrowException) as exc:
                    raise DataSourceError(f"could not open {location}: {exc}") from exc
                yield from _scan_row_groups(fragment, location, row_groups, projection, batch_rows)
            return
        reader = self._s3_reader()
        objects = [S3Object(self.files[part].location, self.files[part].size) for part, _ in groups]
        for (_, row_groups), (key, data) in zip(groups, reader.iter_objects(objects), strict=True):
            where = f"s3://{reader.bucket}/{key}"
            try:
                fragment = _parquet_format().make_fragment(pa.BufferReader(pa.py_buffer(data)))
            except pa.ArrowException as exc:
                raise DataSourceError(f"{where} is not valid parquet: {exc}") from exc
            yield from _scan_row_groups(fragment, where, row_groups, projection, batch_rows)

    def subset(self, units: Sequence[Unit]) -> ParquetSource:
        clone = ParquetSource(
            self.files,
            self.schema,
            units,
            s3_uri=self.s3_uri,
            endpoint_url=self.endpoint_url,
            read_ahead=self.read_ahead,
        )
        clone._reader = self._reader
        return clone

    def shard(self, rank: int, world_size: int) -> ParquetSource:
        assignment = assign_row_groups([unit.num_rows for unit in self.units], world_size)
        return self.subset([self.units[i] for i in assignment[rank]])

    def describe(self) -> str:
        where = (
            self.s3_uri
            if self.s3_uri is not None
            else (self.files[0].location if len(self.files) == 1 else f"{len(self.files)} files")
        )
        return f"parquet {where} ({self.num_rows} rows in {len(self.units)} row groups)"


@functools.cache
def _scan_options() -> pds.ParquetFragmentScanOptions:
    """Stream column chunks through 1 MiB buffers instead of pre-buffering a whole row group.

    Pre-buffering helps high-latency filesystems; here files are local or already in memory,
    and streaming saves about one compressed row group of memory per reader.
    """
    import pyarrow.dataset as pds

    return pds.ParquetFragmentScanOptions(
        use_buffered_stream=True, buffer_size=1 << 20, pre_buffer=False
    )


def _projection(
    schema: pa.Schema, columns: list[str] | None, cast_float64: bool
) -> list[str] | dict[str, pds.Expression] | None:
    """Columns to scan; with ``cast_float64`` float64 and decimal become float32 in the scan."""
    if not cast_float64:
        return columns
    import pyarrow.dataset as pds

    names = schema.names if columns is None else columns
    projection: dict[str, pds.Expression] = {}
    for name in names:
        dtype = schema.field(name).type
        if pa.types.is_float64(dtype) or pa.types.is_decimal(dtype):
            projection[name] = pds.field(name).cast(pa.float32())
        else:
            projection[name] = pds.field(name)
    return projection


def _scan_row_groups(
    fragment: pds.ParquetFileFragment,
    where: str,
    row_groups: list[int],
    projection: list[str] | dict[str, pds.Expression] | None,
    batch_rows: int,
) -> Iterator[pa.RecordBatch]:
    """Scan row groups one at a time, in the given order.

    One row group per scan, streamed through small buffers, keeps memory to a few decoded
    batches (``ParquetFile.iter_batches`` over a whole file pre-buffers far more). Arrow
    decodes columns and evaluates the projection (the float32 cast) on its own threads.
    """
    try:
        for row_group in row_groups:
            yield from fragment.subset(row_group_ids=[row_group]).to_batches(
                columns=projection,
                batch_size=batch_rows,
                batch_readahead=_BATCH_READAHEAD,
                fragment_scan_options=_scan_options(),
                use_threads=True,
            )
    except (OSError, pa.ArrowException) as exc:
        raise DataSourceError(f"could not decode {where}: {exc}") from exc


def _footer_metadata(reader: S3Reader, obj: S3Object, tail: bytes) -> pq.FileMetaData:
    """Parse a parquet footer from the last bytes of an object (fetching more if needed)."""
    where = f"s3://{reader.bucket}/{obj.key}"
    if len(tail) < 8 or tail[-4:] != b"PAR1":
        raise DataSourceError(f"{where} is not a parquet file (no PAR1 footer)")
    footer_len = struct.unpack("<I", tail[-8:-4])[0]
    needed = footer_len + 8
    if needed > obj.size:
        raise DataSourceError(f"{where} has a corrupt parquet footer")
    if needed > len(tail):
        tail = reader.fetch_range(obj, obj.size - needed, obj.size)
    try:
        return pq.read_metadata(pa.BufferReader(pa.py_buffer(tail[-needed:])))
    except pa.ArrowException as exc:
        raise DataSourceError(f"{where} has an unreadable parquet footer: {exc}") from exc
