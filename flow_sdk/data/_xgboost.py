"""The xgboost adapter: a ``DataIter`` over Arrow record batches. xgboost is imported lazily.

Batches go Arrow -> numpy float32 -> xgboost without pandas. :func:`build_quantile_dmatrix`
builds a ``QuantileDMatrix`` (binned, ~1 byte per value with 256 bins) or an
``ExtMemQuantileDMatrix`` (pages cached on disk) and drops the iterator and its batches before
returning, so only the binned matrix stays in memory for training.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from flow_sdk.data._convert import check_numeric_schema, convert_column
from flow_sdk.data._errors import ColumnNotFoundError, MissingDependencyError
from flow_sdk.errors import install_hint

if TYPE_CHECKING:
    import xgboost

    from flow_sdk.data._connector import DataConnector

DEFAULT_XGB_BATCH_ROWS = 262_144


def _require_xgboost() -> Any:
    try:
        import xgboost
    except ImportError as exc:
        raise MissingDependencyError(install_hint("the XGBoost adapter", "xgboost")) from exc
    return xgboost


def batch_to_matrix(
    batch: pa.RecordBatch, input_cols: Sequence[str], label_col: str | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(X, y)``: a C-ordered float32 matrix of ``input_cols`` and a float32 label vector.

    Each column is read zero-copy where Arrow allows and cast to float32 while being written
    into ``X`` (one pass, no float64 matrix). Nulls become NaN, xgboost's missing value.
    """
    matrix = np.empty((batch.num_rows, len(input_cols)), dtype=np.float32)
    for j, name in enumerate(input_cols):
        values, _ = convert_column(batch.column(name), cast_float64=False, name=name)
        matrix[:, j] = values
    label = None
    if label_col is not None:
        values, _ = convert_column(batch.column(label_col), cast_float64=True, name=label_col)
        label = values.astype(np.float32, copy=False)
    return matrix, label


# The methods of ArrowDataIter; data_iter_class() adds its xgboost.DataIter base on first use.
class _DataIterMethods:
    """Feeds xgboost one Arrow record batch at a time as float32 numpy arrays.

    xgboost calls :meth:`reset` then :meth:`next` until it returns ``False``, several
    passes over the data for a ``QuantileDMatrix``. Each pass re-reads the connector, so
    only one batch is held at a time. :meth:`close` drops the connector and any batch.
    """

    def __init__(
        self,
        connector: DataConnector,
        input_cols: Sequence[str],
        label_col: str,
        *,
        batch_size: int = DEFAULT_XGB_BATCH_ROWS,
        weight_col: str | None = None,
        cache_prefix: str | None = None,
    ) -> None:
        self.input_cols = list(input_cols)
        self.label_col = label_col
        self.weight_col = weight_col
        self.batch_size = batch_size
        self.passes = 0
        self.batches_served = 0
        self._connector: DataConnector | None = connector
        self._batches: Iterator[pa.RecordBatch] | None = None
        super().__init__(cache_prefix=cache_prefix, release_data=True)

    def _columns(self) -> list[str]:
        extra = [self.label_col] + ([self.weight_col] if self.weight_col else [])
        return self.input_cols + [c for c in extra if c not in self.input_cols]

    def reset(self) -> None:
        """Start the next pass from the first batch."""
        self._batches = None

    def next(self, input_data: Callable[..., None]) -> bool:
        """Hand xgboost the next batch; ``False`` at the end of a pass."""
        if self._connector is None:
            raise RuntimeError("this ArrowDataIter is closed")
        if self._batches is None:
            # Every batch is copied into a float32 matrix anyway, so reads of exactly
            # batch_size rows (a copy more at row-group boundaries) keep memory lowest.
            self._batches = self._connector._iter_batches(
                self.batch_size,
                self._columns(),
                drop_last=False,
                cast_float64=True,
                read_rows=self.batch_size,
            )
            self.passes += 1
        batch = next(self._batches, None)
        if batch is None:
            self._batches = None
            return False
        features, label = batch_to_matrix(batch, self.input_cols, self.label_col)
        extra: dict[str, Any] = {}
        if self.weight_col is not None:
            weight, _ = convert_column(
                batch.column(self.weight_col), cast_float64=True, name=self.weight_col
            )
            extra["weight"] = weight.astype(np.float32, copy=False)
        input_data(data=features, label=label, feature_names=self.input_cols, **extra)
        self.batches_served += 1
        return True

    def close(self) -> None:
        """Drop the connector and the current batch stream."""
        self._batches = None
        self._connector = None


@functools.cache
def data_iter_class() -> type:
    """Build (once) and return the ``ArrowDataIter`` class (a ``xgboost.DataIter``)."""
    xgb = _require_xgboost()

    class ArrowDataIter(_DataIterMethods, xgb.DataIter):  # type: ignore[misc,name-defined]
        __doc__ = _DataIterMethods.__doc__

    return ArrowDataIter


def make_data_iter(
    connector: DataConnector,
    input_cols: Sequence[str],
    label_col: str,
    *,
    batch_size: int = DEFAULT_XGB_BATCH_ROWS,
    weight_col: str | None = None,
    cache_prefix: str | None = None,
) -> xgboost.DataIter:
    """An ``xgboost.DataIter`` over ``connector``'s batches (see ``ArrowDataIter``).

    Pass it to ``xgboost.QuantileDMatrix(it)``, or, with ``cache_prefix`` (a path prefix for
    xgboost's on-disk cache), to ``xgboost.ExtMemQuantileDMatrix(it)``.
    """
    _check_columns(connector, input_cols, label_col, weight_col)
    iterator: xgboost.DataIter = data_iter_class()(
        connector,
        input_cols,
        label_col,
        batch_size=batch_size,
        weight_col=weight_col,
        cache_prefix=cache_prefix,
    )
    return iterator


def _check_columns(
    connector: DataConnector, input_cols: Sequence[str], label_col: str, weight_col: str | None
) -> None:
    if isinstance(input_cols, str) or not input_cols:
        raise ValueError("input_cols must be a non-empty list of column names")
    wanted = [*input_cols, label_col] + ([weight_col] if weight_col else [])
    missing = [c for c in wanted if c not in connector.schema.names]
    if missing:
        raise ColumnNotFoundError(
            f"column(s) {missing} not found; available: {connector.schema.names}"
        )
    check_numeric_schema(connector.schema, wanted)


def default_nthread() -> int | None:
    """XGBoost threads for this worker: its share of the node's cores, as the worker's
    ``OMP_NUM_THREADS`` says (set per worker by the node agent, or by the user); ``None``
    (XGBoost's own default, every core) when it is not set."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _external_cache(cache_dir: str | os.PathLike[str] | None) -> tuple[str | None, str]:
    """``(temporary directory to remove later or None, cache prefix)`` for xgboost's on-disk
    pages: under ``cache_dir`` (made if missing), or a new temporary directory."""
    temp_dir: str | None = None
    if cache_dir is None:
        temp_dir = tempfile.mkdtemp(prefix="flow-xgb-cache-")
        base = temp_dir
    else:
        base = os.fspath(cache_dir)
        os.makedirs(base, exist_ok=True)
    return temp_dir, os.path.join(base, f"flow-{uuid.uuid4().hex[:12]}")


def build_quantile_dmatrix(
    connector: DataConnector,
    input_cols: Sequence[str],
    label_col: str,
    *,
    external_memory: bool = False,
    batch_size: int = DEFAULT_XGB_BATCH_ROWS,
    ref: xgboost.DMatrix | None = None,
    max_bin: int | None = None,
    weight_col: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    nthread: int | None = None,
) -> xgboost.DMatrix:
    """Build a ``QuantileDMatrix`` (or ``ExtMemQuantileDMatrix``) from ``connector``.

    Batches of ``batch_size`` rows stream through an ``ArrowDataIter`` as float32; no pandas
    frame or float64 matrix is made. Pass the training matrix as ``ref`` when building a
    validation matrix, so both use the same bins. With ``external_memory=True`` xgboost
    caches the binned pages on disk under ``cache_dir`` (default: a temporary directory that
    is removed when the matrix is garbage collected). ``nthread`` defaults to
    :func:`default_nthread` (the worker's share of the node's cores). The iterator and its
    batches are dropped before this returns.
    """
    xgb = _require_xgboost()
    nthread = default_nthread() if nthread is None else nthread
    temp_dir, cache_prefix = _external_cache(cache_dir) if external_memory else (None, None)
    iterator: Any = make_data_iter(
        connector,
        input_cols,
        label_col,
        batch_size=batch_size,
        weight_col=weight_col,
        cache_prefix=cache_prefix,
    )
    matrix: xgboost.DMatrix
    try:
        if external_memory:
            matrix = xgb.ExtMemQuantileDMatrix(iterator, max_bin=max_bin, ref=ref, nthread=nthread)
        else:
            matrix = xgb.QuantileDMatrix(iterator, max_bin=max_bin, ref=ref, nthread=nthread)
    except BaseException:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    finally:
        iterator.close()
        del iterator
    # Hand the freed read buffers back to the OS instead of keeping them in Arrow's pool.
    pa.default_memory_pool().release_unused()
    if temp_dir is not None:
        # xgboost deletes its cache files when the matrix is freed (its __del__ runs before
        # weakref callbacks); then the emptied directory goes. Not at interpreter exit, where
        # the matrix may outlive the callback and xgboost would warn about missing files.
        cleanup = weakref.finalize(matrix, shutil.rmtree, temp_dir, ignore_errors=True)
        cleanup.atexit = False
    return matrix
