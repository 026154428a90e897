"""DataConnector basics: sources, num_rows from metadata, exact batches, conversions, errors."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flow_sdk.data import (
    ColumnNotFoundError,
    DataConnector,
    DataError,
    DataSourceError,
    SchemaMismatchError,
    ShardedDataConnector,
)
from flow_sdk.data._sources import TABLE_UNIT_ROWS, TableSource
from flow_sdk.errors import FlowError


def test_from_parquet_file_and_directory(uneven_dir: tuple[Path, list[int]]) -> None:
    root, sizes = uneven_dir
    directory = DataConnector.from_parquet(root)
    assert directory.num_rows == sum(sizes) and directory.row_group_sizes == sizes
    single = DataConnector.from_parquet(root / "part-01.parquet")
    assert single.num_rows == 640 and single.row_group_sizes == [640]
    assert "3 files" in repr(directory)
    table = directory.to_arrow()
    assert table.num_rows == sum(sizes)
    assert np.array_equal(table.column("id").to_numpy(), np.arange(sum(sizes)))
    expected = pa.concat_tables(pq.read_table(p) for p in sorted(root.glob("*.parquet")))
    assert table.equals(expected)


def test_num_rows_reads_metadata_only(tmp_path: Path, row_group_writer: Callable[..., int]) -> None:
    path = tmp_path / "data.parquet"
    row_group_writer(path, [10, 20, 30])
    connector = DataConnector.from_parquet(path)
    # Corrupt every data page but keep the footer: metadata still answers, reading fails.
    raw = bytearray(path.read_bytes())
    footer_len = int.from_bytes(raw[-8:-4], "little")
    raw[4 : len(raw) - footer_len - 8] = bytes(len(raw) - footer_len - 12)
    path.write_bytes(bytes(raw))
    assert DataConnector.from_parquet(path).num_rows == connector.num_rows == 60
    with pytest.raises(DataSourceError):
        connector.to_arrow()


def test_nested_directories_are_read_in_path_order(
    tmp_path: Path, row_group_writer: Callable[..., int]
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / ".hidden").mkdir()
    row_group_writer(tmp_path / "a" / "x.parquet", [5], start=0)
    row_group_writer(tmp_path / "b" / "x.parquet", [5], start=5)
    row_group_writer(tmp_path / ".hidden" / "x.parquet", [5], start=100)
    (tmp_path / "notes.txt").write_text("not data")
    ids = DataConnector.from_parquet(tmp_path).to_arrow(["id"]).column("id").to_pylist()
    assert ids == list(range(10))


def test_in_memory_sources(table_maker: Callable[..., pa.Table]) -> None:
    table = table_maker(0, 100)
    from_arrow = DataConnector.from_arrow(table)
    assert from_arrow.num_rows == 100 and from_arrow.to_arrow().equals(table)
    from_batch = DataConnector.from_arrow(table.to_batches()[0])
    assert from_batch.to_arrow().equals(table)
    frame = table.to_pandas()
    from_pandas = DataConnector.from_pandas(frame)
    pd.testing.assert_frame_equal(from_pandas.to_pandas(), frame)
    assert from_pandas.column_names == list(frame.columns)


@pytest.mark.parametrize("batch_size", [1, 99, 500, 4096, 10_000])
def test_iter_batches_exact_sizes_in_order(
    uneven_dir: tuple[Path, list[int]], batch_size: int
) -> None:
    connector = DataConnector.from_parquet(uneven_dir[0])
    batches = list(connector.iter_batches(batch_size, columns=["id", "x64"]))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    sizes = [b.num_rows for b in batches]
    full, rest = divmod(connector.num_rows, batch_size)
    assert sizes == [batch_size] * full + ([rest] if rest else [])
    ids = np.concatenate([b.column("id").to_numpy() for b in batches])
    assert np.array_equal(ids, np.arange(connector.num_rows))
    assert batches[0].schema.names == ["id", "x64"]
    assert batches[0].schema.field("x64").type == pa.float64()  # values as stored
    dropped = list(connector.iter_batches(batch_size, drop_last=True))
    assert [b.num_rows for b in dropped] == [batch_size] * full


def test_iter_batches_slices_share_memory() -> None:
    table = pa.table({"x": np.arange(1000, dtype=np.float32)})
    batches = list(DataConnector.from_arrow(table).iter_batches(100))
    base = table.column("x").chunk(0).buffers()[1].address
    assert [b.column(0).buffers()[1].address + b.column(0).offset * 4 for b in batches] == [
        base + 400 * i for i in range(10)
    ]


def test_a_batch_across_table_blocks_is_a_view_and_shuffled_blocks_are_still_read_whole() -> None:
    rows = 3 * TABLE_UNIT_ROWS + 5
    table = pa.table({"x": np.arange(rows, dtype=np.float32)})
    base = table.column("x").chunk(0).buffers()[1].address
    batches = list(DataConnector.from_arrow(table).iter_batches(2 * TABLE_UNIT_ROWS))
    assert [b.num_rows for b in batches] == [2 * TABLE_UNIT_ROWS, TABLE_UNIT_ROWS + 5]
    assert [b.column(0).buffers()[1].address + b.column(0).offset * 4 for b in batches] == [
        base, base + 2 * TABLE_UNIT_ROWS * 4]
    source = TableSource(table)
    order = [source.units[i] for i in (2, 3, 0, 1)]  # as a shuffle may order them
    reads = list(source.read(order, None, 10 * TABLE_UNIT_ROWS))
    assert [r.column(0)[0].as_py() for r in reads] == [2 * TABLE_UNIT_ROWS, 0]
    assert pa.concat_tables(pa.Table.from_batches([r]) for r in reads).column(0).to_pylist() \
        == list(range(2 * TABLE_UNIT_ROWS, rows)) + list(range(2 * TABLE_UNIT_ROWS))


def test_unknown_columns_and_sources_are_clear_errors(tmp_path: Path) -> None:
    connector = DataConnector.from_arrow(pa.table({"a": [1]}))
    with pytest.raises(ColumnNotFoundError, match="'b'") as info:
        list(connector.iter_batches(1, columns=["b"]))
    assert isinstance(info.value, DataError) and isinstance(info.value, FlowError)
    with pytest.raises(DataSourceError, match="does not exist"):
        DataConnector.from_parquet(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataSourceError, match="no parquet files"):
        DataConnector.from_parquet(tmp_path / "empty")
    (tmp_path / "bad.parquet").write_bytes(b"nope")
    with pytest.raises(DataSourceError, match=r"bad\.parquet"):
        DataConnector.from_parquet(tmp_path / "bad.parquet")
    with pytest.raises(DataSourceError):
        DataConnector.from_arrow({"a": [1]})  # type: ignore[arg-type]


def test_mismatched_schemas_are_rejected(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "one.parquet")
    pq.write_table(pa.table({"a": [1.5]}), tmp_path / "two.parquet")
    with pytest.raises(SchemaMismatchError, match=r"two\.parquet"):
        DataConnector.from_parquet(tmp_path)


def test_connectors_pickle_for_remote_workers(uneven_dir: tuple[Path, list[int]]) -> None:
    sharded = ShardedDataConnector.from_parquet(uneven_dir[0])
    clone = pickle.loads(pickle.dumps(sharded))
    assert clone.get_shard(1, 3).to_arrow().equals(sharded.get_shard(1, 3).to_arrow())
    memory = ShardedDataConnector.from_arrow(pa.table({"id": np.arange(10)}))
    assert pickle.loads(pickle.dumps(memory)).get_shard(0, 2).num_rows == 5
