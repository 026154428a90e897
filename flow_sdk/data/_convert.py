"""Arrow -> numpy conversion on the lean memory path.

Rules, applied per column and per batch (so the float64 -> float32 cast happens on batch
boundaries and never materialises a float64 copy of the whole dataset):

* a primitive numeric column (integer or floating point) with no nulls in a single chunk is
  returned as a zero-copy view of its Arrow data buffer;
* ``float64`` is cast to ``float32`` when ``cast_float64`` is true (the lean path), unless
  the caller casts it itself while copying it (``cast_later``: a float64 column with no nulls
  is then left as it is, a view);
* ``decimal`` is converted to ``float64`` (``float32`` on the lean path);
* nulls become ``NaN``; an integer column with nulls becomes ``float64`` (``float32`` on the
  lean path); a boolean column with nulls becomes floating point too;
* a column split into several chunks is concatenated, dictionary columns are decoded, booleans
  (bit-packed in Arrow) are unpacked.

Every rule but the first copies, and the functions here say why (see :func:`column_to_numpy`).
"""

from __future__ import annotations

import logging
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flow_sdk.data._errors import UnsupportedColumnError

logger = logging.getLogger("flow_sdk.data")

ArrowColumn: TypeAlias = pa.Array | pa.ChunkedArray


def _is_numeric(dtype: pa.DataType) -> bool:
    return bool(pa.types.is_integer(dtype) or pa.types.is_floating(dtype))


def _float_type(cast_float64: bool) -> pa.DataType:
    return pa.float32() if cast_float64 else pa.float64()


def _single_array(column: ArrowColumn, reasons: list[str]) -> pa.Array:
    if isinstance(column, pa.Array):
        return column
    if column.num_chunks == 1:
        return column.chunk(0)
    if column.num_chunks == 0:
        return pa.array([], type=column.type)
    reasons.append(f"{column.num_chunks} chunks concatenated")
    return pa.concat_arrays(column.chunks)


def _normalise(array: pa.Array, cast_float64: bool, reasons: list[str],
               cast_later: bool = False) -> pa.Array:
    """Turn ``array`` into a primitive numeric array, recording each copy made."""
    dtype = array.type
    if pa.types.is_dictionary(dtype):
        reasons.append("dictionary-encoded column decoded")
        array = array.dictionary_decode()
        dtype = array.type
    if pa.types.is_decimal(dtype):
        target = _float_type(cast_float64)
        reasons.append(f"{dtype} converted to {target}")
        return pc.cast(array, target)
    if pa.types.is_null(dtype):
        target = _float_type(cast_float64)
        reasons.append(f"all-null column converted to {target} NaN")
        return pa.nulls(len(array), type=target)
    if pa.types.is_boolean(dtype):
        if array.null_count:
            target = _float_type(cast_float64)
            reasons.append(f"boolean column with {array.null_count} null(s) converted to {target}")
            return pc.cast(array, target)
        return array
    if not _is_numeric(dtype):
        raise UnsupportedColumnError(
            f"Arrow type {dtype} cannot be converted to a numeric array; "
            "cast the column to a number first, or leave it out with `columns=`"
        )
    if pa.types.is_integer(dtype) and array.null_count:
        target = _float_type(cast_float64)
        reasons.append(f"integer column with {array.null_count} null(s) converted to {target}")
        return pc.cast(array, target)
    if cast_float64 and pa.types.is_float64(dtype):
        if cast_later and not array.null_count:
            return array  # the caller casts it while copying it
        reasons.append("float64 cast to float32 (lean path)")
        return pc.cast(array, pa.float32())
    return array


def _to_numpy(array: pa.Array, reasons: list[str], writable: bool) -> np.ndarray:
    dtype = array.type
    result: np.ndarray
    if pa.types.is_boolean(dtype):
        reasons.append("booleans are bit-packed in Arrow; unpacked")
        result = array.to_numpy(zero_copy_only=False, writable=True)
        return result
    if array.null_count:
        reasons.append(f"{array.null_count} null(s) filled with NaN")
        result = array.to_numpy(zero_copy_only=False, writable=True)
        return result
    if not writable:
        result = array.to_numpy(zero_copy_only=True)
        return result
    buffer = array.buffers()[1]
    np_dtype = np.dtype(dtype.to_pandas_dtype())
    if buffer is None:
        return np.empty(0, dtype=np_dtype)
    if not buffer.is_mutable:
        reasons.append("Arrow buffer is immutable; copied to give a writable array")
        result = array.to_numpy(zero_copy_only=True).copy()
        return result
    return np.frombuffer(
        buffer, dtype=np_dtype, count=len(array), offset=array.offset * np_dtype.itemsize
    )


def convert_column(
    column: ArrowColumn, *, cast_float64: bool, writable: bool = False, name: str | None = None,
    cast_later: bool = False,
) -> tuple[np.ndarray, str | None]:
    """Convert one column; ``writable`` views share the Arrow buffer but may be written to.

    ``cast_later``: a float64 column without nulls stays float64 even with ``cast_float64``;
    the caller casts it while copying it anyway (one pass instead of two). ``name`` only
    improves error and log messages.
    """
    reasons: list[str] = []
    try:
        array = _normalise(_single_array(column, reasons), cast_float64, reasons, cast_later)
    except UnsupportedColumnError as exc:
        if name is None:
            raise
        raise UnsupportedColumnError(f"column {name!r}: {exc}") from None
    result = _to_numpy(array, reasons, writable)
    reason = "; ".join(reasons) if reasons else None
    if reason is not None and logger.isEnabledFor(logging.DEBUG):
        logger.debug("column %s copied: %s", name if name is not None else "?", reason)
    return result, reason


def column_to_numpy(
    array: ArrowColumn, *, cast_float64: bool = False
) -> tuple[np.ndarray, str | None]:
    """Convert an Arrow column to a 1-D numpy array, without copying when it can.

    Returns ``(values, reason)``. ``reason`` is ``None`` when ``values`` is a read-only view of
    the Arrow data buffer (a primitive numeric column, no nulls, a single chunk), otherwise a
    short description of why a copy was made, e.g. ``"3 chunks concatenated"`` or
    ``"2 null(s) filled with NaN"``. With ``cast_float64=True`` float64 (and decimal, and
    integer-with-null) columns come back as float32.

    Raises :class:`~flow_sdk.data.UnsupportedColumnError` for non-numeric types (strings,
    timestamps, nested types).
    """
    return convert_column(array, cast_float64=cast_float64, writable=False)


def batch_to_numpy(
    batch: pa.RecordBatch | pa.Table, *, cast_float64: bool, writable: bool = False,
    cast_later: bool = False,
) -> dict[str, np.ndarray]:
    """Convert every column of ``batch`` with :func:`convert_column`, keyed by column name."""
    return {
        name: convert_column(column, cast_float64=cast_float64, writable=writable, name=name,
                             cast_later=cast_later)[0]
        for name, column in zip(batch.schema.names, batch.columns, strict=True)
    }


def check_numeric_schema(schema: pa.Schema, columns: list[str]) -> None:
    """Fail early, before any data is read, if a selected column cannot become numeric."""
    for name in columns:
        dtype = schema.field(name).type
        if pa.types.is_dictionary(dtype):
            dtype = dtype.value_type
        ok = (
            _is_numeric(dtype)
            or pa.types.is_decimal(dtype)
            or pa.types.is_boolean(dtype)
            or pa.types.is_null(dtype)
        )
        if not ok:
            raise UnsupportedColumnError(
                f"column {name!r} has Arrow type {dtype}, which cannot be converted to a "
                "numeric array; cast it to a number first, or leave it out with `columns=`"
            )
