"""The torch adapter: an ``IterableDataset`` over a data source. torch is imported lazily.

The dataset class subclasses ``torch.utils.data.IterableDataset``, so it is built on first use
(by :func:`dataset_class`) rather than at import time; ``flow_sdk.data._torch.ArrowTorchDataset``
resolves to it (and pickles by reference) once torch is importable.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from flow_sdk.data._convert import batch_to_numpy, check_numeric_schema
from flow_sdk.data._errors import MissingDependencyError
from flow_sdk.errors import install_hint
from flow_sdk.data._pipeline import align, read_rows_for, rebatch_generic
from flow_sdk.data._pipeline import prefetch as run_prefetched
from flow_sdk.data._sharding import assign_row_groups
from flow_sdk.data._sources import Source, Unit

if TYPE_CHECKING:
    import pyarrow as pa
    import torch

    TensorDict = dict[str, torch.Tensor]

    class ArrowTorchDataset(torch.utils.data.IterableDataset[dict[str, torch.Tensor]]):
        """What type checkers see of the class that :func:`dataset_class` builds at run time."""

        source: Source
        batch_size: int
        shuffle: bool
        seed: int
        epoch: int
        columns: list[str]
        cast_float64: bool
        drop_last: bool
        shuffle_buffer_rows: int
        prefetch: int
        device: str | None
        num_rows: int

        def set_epoch(self, epoch: int) -> None: ...
        def unit_order(self, worker_id: int = 0, num_workers: int = 1) -> list[Unit]: ...
        def __iter__(self) -> Iterator[dict[str, torch.Tensor]]: ...


DEFAULT_SHUFFLE_BUFFER_ROWS = 262_144

_DATASET_DOC = """Batches of a data source as ``{column name: tensor}`` dicts.

    Each item is one batch of exactly ``batch_size`` rows (the last may be shorter unless
    ``drop_last``); use ``DataLoader(dataset, batch_size=None)``.

    Lean memory path: float64 columns (and decimals, and integers with nulls) become float32
    on each read batch (``cast_float64=False`` keeps float64); nulls become NaN. Numeric
    columns without nulls are zero-copy: the tensor shares memory with the Arrow buffer, so for
    in-memory sources (``from_arrow`` / ``from_pandas``) writing into a tensor in place changes
    the source table; ``.clone()`` first if you need to do that.

    Shuffling (``shuffle=True``) does exactly two things, both seeded by ``(seed, epoch)``:
    1. the order of units is permuted: parquet row groups, or 65,536-row blocks of an
       in-memory table;
    2. rows are permuted within a buffer: read batches, in the permuted unit order, fill a
       buffer until it holds at least ``shuffle_buffer_rows`` rows (default 262,144), the
       buffer's rows are permuted, and batches are cut from the result.
    Every row is seen exactly once per epoch and no row crosses from one epoch to the next.
    The same seed and epoch always give the same batches; call :meth:`set_epoch` at the start
    of each epoch for a new order (as with ``DistributedSampler``). ``seed=None`` draws one
    seed when the dataset is created.

    DataLoader workers: with ``num_workers > 1`` each worker reads a disjoint, balanced,
    contiguous run of the (permuted) units, so together they yield every row once.

    ``device="cuda"`` (or ``"cuda:N"``; ``"cuda"`` is this process's current GPU, so call
    ``torch.cuda.set_device(LOCAL_RANK)`` first) hands out batches already on the GPU: each
    batch is made as above, staged in reused pinned host buffers (without shuffling, float64
    columns are cast to float32 in that copy, not in a pass of their own) and copied with
    ``non_blocking=True`` on a side stream while the previous batch is in use; values equal
    the CPU batches bit for bit. The columns of one dtype share one device tensor (each is a
    view of its own part): a column kept after its batch keeps that tensor alive, so
    ``.clone()`` one you keep for long. Iterate it in the training process itself (not in
    DataLoader workers, which must not touch CUDA). ``device="cpu"`` runs the same staging
    with plain host buffers (the batches are then copies, not views of Arrow buffers).
    """


def _require_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError(install_hint("to_torch_dataset()", "torch")) from exc
    return torch


def _tensor_rows(chunk: TensorDict) -> int:
    return int(next(iter(chunk.values())).shape[0]) if chunk else 0


def _cut(chunk: TensorDict, start: int, stop: int) -> TensorDict:
    return {name: tensor[start:stop] for name, tensor in chunk.items()}


def _split(chunk: TensorDict, start: int, count: int, size: int) -> Iterator[TensorDict]:
    torch = _require_torch()
    names = list(chunk)
    columns = [torch.split(chunk[name][start : start + count * size], size) for name in names]
    return (dict(zip(names, pieces, strict=True)) for pieces in zip(*columns, strict=True))


def _join(pieces: list[TensorDict]) -> TensorDict:
    if len(pieces) == 1:
        return pieces[0]
    torch = _require_torch()
    return {name: torch.cat([p[name] for p in pieces]) for name in pieces[0]}


class _DatasetMethods:
    """Everything of ``ArrowTorchDataset`` but its torch base class, which
    :func:`dataset_class` adds on first use."""

    def __init__(
        self,
        source: Source,
        *,
        batch_size: int,
        shuffle: bool = False,
        seed: int | None = None,
        columns: list[str] | None = None,
        cast_float64: bool = True,
        drop_last: bool = False,
        shuffle_buffer_rows: int | None = None,
        prefetch: int = 0,
        device: str | None = None,
    ) -> None:
        from flow_sdk.data._device import resolve_device

        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be 0 or more, got {prefetch}")
        self.columns = list(source.schema.names) if columns is None else list(columns)
        if not self.columns:
            raise ValueError("to_torch_dataset() needs at least one column")
        check_numeric_schema(source.schema, self.columns)
        self.source = source
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = secrets.randbits(63) if seed is None else int(seed)
        self.cast_float64 = cast_float64
        self.drop_last = drop_last
        self.shuffle_buffer_rows = (
            max(batch_size, DEFAULT_SHUFFLE_BUFFER_ROWS)
            if shuffle_buffer_rows is None
            else max(1, shuffle_buffer_rows)
        )
        self.prefetch = prefetch
        resolve_device(device)  # fails here, before any read, on a device torch lacks
        self.device = None if device is None else str(device)
        self.epoch = 0

    def __repr__(self) -> str:
        return (
            f"ArrowTorchDataset({self.source.describe()}, batch_size={self.batch_size}, "
            f"shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch})"
        )

    @property
    def num_rows(self) -> int:
        """Rows per epoch (before ``drop_last``), over all DataLoader workers."""
        return self.source.num_rows

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffle order of this epoch (no effect without shuffling)."""
        self.epoch = int(epoch)

    def unit_order(self, worker_id: int = 0, num_workers: int = 1) -> list[Unit]:
        """The units this worker reads this epoch, in reading order."""
        units = list(self.source.units)
        if self.shuffle:
            rng = np.random.default_rng([self.seed, self.epoch])
            units = [units[i] for i in rng.permutation(len(units))]
        if num_workers > 1:
            assignment = assign_row_groups([u.num_rows for u in units], num_workers)
            units = [units[i] for i in assignment[worker_id]]
        return units

    def __iter__(self) -> Iterator[TensorDict]:
        from torch.utils.data import get_worker_info

        from flow_sdk.data._device import DeviceStager, resolve_device

        info = get_worker_info()
        if self.device is not None and info is not None:
            raise RuntimeError(f"device={self.device!r} batches are made in the training "
                               "process, not in DataLoader workers (which must not use "
                               "CUDA); iterate the dataset directly or with num_workers=0")
        target = resolve_device(self.device)
        worker_id, num_workers = (info.id, info.num_workers) if info else (0, 1)
        units = self.unit_order(worker_id, num_workers)
        group = read_rows_for(self.batch_size) // self.batch_size
        # On a device the float32 cast of float64 columns happens in the staging copy, unless
        # shuffling copies the rows anyway (it then moves half the bytes after the cast).
        cast_later = target is not None and not self.shuffle
        batches = run_prefetched(lambda: self._batches(units, worker_id, cast_later),
                                 self.prefetch, group)
        if target is None:
            return batches
        return DeviceStager(target, cast_float64=self.cast_float64).batches(batches)

    def _to_tensors(self, batch: pa.RecordBatch, cast_later: bool) -> TensorDict:
        torch = _require_torch()
        arrays = batch_to_numpy(batch, cast_float64=self.cast_float64, writable=True,
                                cast_later=cast_later)
        return {name: torch.from_numpy(array) for name, array in arrays.items()}

    def _batches(self, units: Sequence[Unit], worker_id: int,
                 cast_later: bool) -> Iterator[TensorDict]:
        read_rows = read_rows_for(self.batch_size)
        reads = self.source.read(units, self.columns, read_rows, cast_float64=self.cast_float64)
        chunks: Iterator[TensorDict] = (
            self._to_tensors(batch, cast_later) for batch in align(reads, self.batch_size)
        )
        if self.shuffle:
            rng = np.random.default_rng([self.seed, self.epoch, worker_id, 1])
            chunks = self._shuffled(chunks, rng)
        return rebatch_generic(
            chunks,
            self.batch_size,
            length=_tensor_rows,
            cut=_cut,
            join=_join,
            drop_last=self.drop_last,
            split=_split,
        )

    def _shuffled(
        self, chunks: Iterator[TensorDict], rng: np.random.Generator
    ) -> Iterator[TensorDict]:
        pending: list[TensorDict] = []
        rows = 0
        for chunk in chunks:
            pending.append(chunk)
            rows += _tensor_rows(chunk)
            if rows >= self.shuffle_buffer_rows:
                yield self._permuted(_join(pending), rows, rng)
                pending, rows = [], 0
        if rows:
            yield self._permuted(_join(pending), rows, rng)

    @staticmethod
    def _permuted(chunk: TensorDict, rows: int, rng: np.random.Generator) -> TensorDict:
        order = _require_torch().from_numpy(rng.permutation(rows))
        return {name: tensor.index_select(0, order) for name, tensor in chunk.items()}


@functools.cache
def dataset_class() -> type:
    """Build (once) and return the ``ArrowTorchDataset`` class."""
    _require_torch()
    from torch.utils.data import IterableDataset

    class _ArrowTorchDataset(_DatasetMethods, IterableDataset):  # type: ignore[type-arg]
        __doc__ = _DATASET_DOC

    _ArrowTorchDataset.__name__ = "ArrowTorchDataset"
    _ArrowTorchDataset.__qualname__ = "ArrowTorchDataset"
    _ArrowTorchDataset.__module__ = __name__
    return _ArrowTorchDataset


def make_torch_dataset(source: Source, **options: Any) -> ArrowTorchDataset:
    """Create an ``ArrowTorchDataset`` over ``source`` (see its docstring for ``options``)."""
    dataset: ArrowTorchDataset = dataset_class()(source, **options)
    return dataset


def __getattr__(name: str) -> Any:
    if name == "ArrowTorchDataset":
        return dataset_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
