"""The lean memory path: float32 casts, zero-copy views, and the reasons for every copy."""

from __future__ import annotations

import decimal
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from flow_sdk.data import DataConnector, UnsupportedColumnError, column_to_numpy
from flow_sdk.data._convert import convert_column


def buffer_address(array: pa.Array) -> int:
    """Address of element 0 of a primitive Arrow array."""
    return int(array.buffers()[1].address + array.offset * array.type.byte_width)


def numpy_address(values: np.ndarray) -> int:
    return int(values.__array_interface__["data"][0])


@pytest.mark.parametrize(
    "array",
    [
        pa.array(np.arange(10, dtype=np.float32)),
        pa.array(np.arange(10, dtype=np.float64)),
        pa.array(np.arange(10, dtype=np.int64)),
        pa.array(np.arange(10, dtype=np.uint8)),
        pa.array(np.arange(20, dtype=np.int32)).slice(5, 10),
        pa.chunked_array([pa.array(np.arange(10, dtype=np.float32))]),
    ],
    ids=["float32", "float64", "int64", "uint8", "sliced", "one-chunk"],
)
def test_primitive_columns_are_zero_copy(array: pa.Array | pa.ChunkedArray) -> None:
    values, reason = column_to_numpy(array)
    assert reason is None
    chunk = array.chunk(0) if isinstance(array, pa.ChunkedArray) else array
    assert numpy_address(values) == buffer_address(chunk)
    assert np.array_equal(values, chunk.to_numpy())
    assert not values.flags.writeable  # a view of Arrow memory is read-only by default


def test_torch_tensor_shares_the_arrow_buffer() -> None:
    table = pa.table(
        {"f32": np.arange(64, dtype=np.float32), "f64": np.arange(64, dtype=np.float64)}
    )
    connector = DataConnector.from_arrow(table)
    batch = next(iter(connector.to_torch_dataset(64, cast_float64=False, prefetch=0)))
    for name in ("f32", "f64"):
        address = buffer_address(table.column(name).chunk(0))
        values, reason = column_to_numpy(table.column(name))
        assert reason is None and numpy_address(values) == address
        assert batch[name].data_ptr() == address
    # Slices of one read batch keep sharing memory.
    second = list(connector.to_torch_dataset(16, cast_float64=False, prefetch=0))[1]
    assert second["f32"].data_ptr() == buffer_address(table.column("f32").chunk(0)) + 16 * 4


def test_float64_is_cast_to_float32_unless_opted_out(uneven_dir: tuple[Path, list[int]]) -> None:
    values, reason = column_to_numpy(pa.array([1.5, 2.25]), cast_float64=True)
    assert values.dtype == np.float32 and reason is not None and "float32" in reason
    connector = DataConnector.from_parquet(uneven_dir[0])
    lean = next(iter(connector.to_torch_dataset(100)))
    assert lean["x64"].dtype == torch.float32
    assert lean["x32"].dtype == torch.float32
    assert lean["id"].dtype == torch.int64 and lean["small"].dtype == torch.int32
    full = next(iter(connector.to_torch_dataset(100, cast_float64=False)))
    assert full["x64"].dtype == torch.float64
    expected = pq.read_table(uneven_dir[0] / "part-00.parquet").column("x64").to_numpy()[:100]
    assert np.array_equal(full["x64"].numpy(), expected)
    assert np.allclose(lean["x64"].numpy(), expected.astype(np.float32))


def test_in_memory_float64_cast_per_batch() -> None:
    table = pa.table({"x": np.linspace(0, 1, 1000)})
    batches = list(DataConnector.from_arrow(table).to_torch_dataset(300))
    assert [b["x"].dtype for b in batches] == [torch.float32] * 4
    assert np.allclose(torch.cat([b["x"] for b in batches]).numpy(), np.linspace(0, 1, 1000))


def test_chunked_column_reports_copy() -> None:
    column = pa.chunked_array([[1.0, 2.0], [3.0]], type=pa.float32())
    values, reason = column_to_numpy(column)
    assert reason is not None and "2 chunks" in reason
    assert values.tolist() == [1.0, 2.0, 3.0]


def test_nullable_float_gives_nan_and_reason() -> None:
    values, reason = column_to_numpy(pa.array([1.0, None, 3.0]))
    assert reason is not None and "null" in reason
    assert values.dtype == np.float64
    assert values[0] == 1.0 and np.isnan(values[1]) and values[2] == 3.0
    lean, _ = column_to_numpy(pa.array([1.0, None, 3.0]), cast_float64=True)
    assert lean.dtype == np.float32 and np.isnan(lean[1])


@pytest.mark.parametrize("dtype", [pa.int8(), pa.int32(), pa.int64(), pa.uint16()])
def test_nullable_integers_become_float_with_nan(dtype: pa.DataType) -> None:
    array = pa.array([1, None, 7], type=dtype)
    values, reason = column_to_numpy(array)
    assert values.dtype == np.float64 and reason is not None and "null" in reason
    assert values[0] == 1 and np.isnan(values[1]) and values[2] == 7
    lean, _ = column_to_numpy(array, cast_float64=True)
    assert lean.dtype == np.float32 and np.isnan(lean[1]) and lean[2] == 7


def test_decimal_becomes_float() -> None:
    array = pa.array(
        [decimal.Decimal("1.25"), None, decimal.Decimal("-3.50")], type=pa.decimal128(10, 2)
    )
    values, reason = column_to_numpy(array)
    assert values.dtype == np.float64 and reason is not None and "decimal" in reason
    assert values[0] == 1.25 and np.isnan(values[1]) and values[2] == -3.5
    lean, _ = column_to_numpy(array, cast_float64=True)
    assert lean.dtype == np.float32 and lean[2] == np.float32(-3.5)


def test_decimal_and_nullable_columns_through_parquet_and_torch(tmp_path: Path) -> None:
    table = pa.table(
        {
            "price": pa.array(
                [decimal.Decimal("10.10"), decimal.Decimal("0.05"), None, decimal.Decimal(7)],
                type=pa.decimal128(12, 2),
            ),
            "count": pa.array([1, None, 3, 4], type=pa.int64()),
            "score": pa.array([0.5, 1.5, None, 2.5]),
        }
    )
    pq.write_table(table, tmp_path / "d.parquet")
    for connector in (DataConnector.from_parquet(tmp_path), DataConnector.from_arrow(table)):
        for cast, dtype in ((True, torch.float32), (False, torch.float64)):
            batch = next(iter(connector.to_torch_dataset(4, cast_float64=cast)))
            assert {t.dtype for t in batch.values()} == {dtype}
            price = batch["price"].numpy()
            assert np.allclose(price[[0, 1, 3]], [10.10, 0.05, 7.0]) and np.isnan(price[2])
            count = batch["count"].numpy()
            assert count[0] == 1 and np.isnan(count[1]) and count[3] == 4
            score = batch["score"].numpy()
            assert score[1] == 1.5 and np.isnan(score[2])


def test_booleans_and_dictionaries_are_unpacked() -> None:
    values, reason = column_to_numpy(pa.array([True, False, True]))
    assert values.dtype == np.bool_ and reason is not None and "bit-packed" in reason
    nullable, _ = column_to_numpy(pa.array([True, None]))
    assert nullable[0] == 1.0 and np.isnan(nullable[1])
    encoded = pa.array([1.5, 2.5, 1.5]).dictionary_encode()
    values, reason = column_to_numpy(encoded)
    assert values.tolist() == [1.5, 2.5, 1.5] and reason is not None and "dictionary" in reason


def test_non_numeric_column_is_rejected_with_its_name() -> None:
    with pytest.raises(UnsupportedColumnError, match="string"):
        column_to_numpy(pa.array(["a", "b"]))
    connector = DataConnector.from_arrow(pa.table({"name": ["a", "b"], "x": [1.0, 2.0]}))
    with pytest.raises(UnsupportedColumnError, match="'name'"):
        connector.to_torch_dataset(2)
    batch = next(iter(connector.to_torch_dataset(2, columns=["x"])))
    assert list(batch) == ["x"]


def test_writable_view_shares_memory_and_copies_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    array = pa.array(np.arange(8, dtype=np.float32))
    values, reason = convert_column(array, cast_float64=True, writable=True)
    assert reason is None and values.flags.writeable
    assert numpy_address(values) == buffer_address(array)
    with caplog.at_level(logging.DEBUG, logger="flow_sdk.data"):
        convert_column(pa.array([1, None]), cast_float64=True, name="maybe")
    assert any("maybe" in r.getMessage() and "null" in r.getMessage() for r in caplog.records)


def test_cast_later_leaves_float64_without_nulls_as_a_view() -> None:
    array = pa.array(np.linspace(0, 1, 8))
    values, reason = convert_column(array, cast_float64=True, writable=True, cast_later=True)
    assert reason is None and values.dtype == np.float64
    assert numpy_address(values) == buffer_address(array)
    values, reason = convert_column(pa.array([0.5, None]), cast_float64=True, cast_later=True)
    assert values.dtype == np.float32 and reason is not None and "float32" in reason


def test_import_does_not_load_torch_xgboost_or_boto3() -> None:
    code = (
        "import sys, flow_sdk.data\n"
        "heavy = [m for m in ('torch', 'xgboost', 'boto3', 'botocore', 'pandas') "
        "if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_iter_batches_keeps_values_as_stored(table_maker: Callable[..., pa.Table]) -> None:
    table = table_maker(0, 10)
    batch = next(DataConnector.from_arrow(table).iter_batches(10))
    assert batch.schema == table.schema
