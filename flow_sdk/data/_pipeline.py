"""Streaming helpers: exact-size re-batching and a bounded background prefetch."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

import pyarrow as pa

T = TypeVar("T")

MIN_READ_ROWS = 65_536
MIN_BATCHES_PER_READ = 4


def read_rows_for(batch_size: int) -> int:
    """Rows per read from a source: a multiple of ``batch_size``, at least 65,536 rows and
    at least four batches.

    Reading in large batches keeps per-batch overhead low, and requested batches that lie
    inside one read are zero-copy slices. Reads restart at every row group, so after the first
    short read a batch may straddle two reads and be copied: with four or more batches per
    read, at most one in four is.
    """
    return batch_size * max(MIN_BATCHES_PER_READ, -(-MIN_READ_ROWS // batch_size))


def concat_record_batches(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One record batch holding ``batches`` end to end (a copy unless there is only one)."""
    if len(batches) == 1:
        return batches[0]
    concat = getattr(pa, "concat_batches", None)
    if concat is not None:
        result: pa.RecordBatch = concat(batches)
        return result
    table = pa.Table.from_batches(batches).combine_chunks()
    combined = table.to_batches()
    if len(combined) == 1:
        return combined[0]
    return pa.RecordBatch.from_arrays(
        [column.combine_chunks() for column in table.columns], schema=table.schema
    )


def rebatch_generic(
    chunks: Iterable[T],
    batch_size: int,
    *,
    length: Callable[[T], int],
    cut: Callable[[T, int, int], T],
    join: Callable[[list[T]], T],
    drop_last: bool = False,
    split: Callable[[T, int, int, int], Iterable[T]] | None = None,
) -> Iterator[T]:
    """Re-cut a stream of row chunks into chunks of exactly ``batch_size`` rows.

    ``length`` counts a chunk's rows, ``cut(chunk, start, stop)`` slices it and ``join``
    concatenates pieces; ``split(chunk, start, count, size)``, if given, returns ``count``
    consecutive slices of ``size`` rows from ``start`` in one go (faster than ``cut`` for
    each). Only the last batch may be shorter (or is dropped with ``drop_last``). A batch
    inside one chunk is a slice; only batches spanning chunks are joined.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    pending: list[T] = []
    pending_rows = 0
    for chunk in chunks:
        rows = length(chunk)
        if rows == 0:
            continue
        offset = 0
        if pending_rows:
            take = min(batch_size - pending_rows, rows)
            pending.append(cut(chunk, 0, take))
            pending_rows += take
            offset = take
            if pending_rows < batch_size:
                continue
            yield join(pending)
            pending, pending_rows = [], 0
        full = (rows - offset) // batch_size
        if full and split is not None:
            yield from split(chunk, offset, full, batch_size)
            offset += full * batch_size
        while rows - offset >= batch_size:
            yield cut(chunk, offset, offset + batch_size)
            offset += batch_size
        if offset < rows:
            pending = [cut(chunk, offset, rows)]
            pending_rows = rows - offset
    if pending_rows and not drop_last:
        yield join(pending)


def _whole_run(batch: pa.RecordBatch, start: int, count: int, size: int) -> list[pa.RecordBatch]:
    return [batch.slice(start, count * size)]


def rebatch(
    batches: Iterable[pa.RecordBatch],
    batch_size: int,
    *,
    drop_last: bool = False,
    whole_runs: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Re-cut record batches into batches of exactly ``batch_size`` rows (see above).

    With ``whole_runs`` each run of whole batches inside one input comes out as one zero-copy
    slice instead (its length a multiple of ``batch_size``); see :func:`align`.
    """
    return rebatch_generic(
        batches,
        batch_size,
        length=lambda batch: batch.num_rows,
        cut=lambda batch, start, stop: batch.slice(start, stop - start),
        join=concat_record_batches,
        drop_last=drop_last,
        split=_whole_run if whole_runs else None,
    )


def align(batches: Iterable[pa.RecordBatch], batch_size: int) -> Iterator[pa.RecordBatch]:
    """Re-cut record batches so that each holds a whole number of ``batch_size`` rows.

    Only the last may hold fewer. Runs of whole batches inside one input are zero-copy slices;
    a batch that straddles two inputs is concatenated in Arrow's memory pool, which reuses
    its pages (a tensor concatenation allocates fresh, page-faulting memory each time).
    Converting the aligned batches and splitting them into ``batch_size`` pieces then needs
    no further copy.
    """
    return rebatch(batches, batch_size, whole_runs=True)


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_END = object()


class Prefetcher(Generic[T]):
    """Run ``produce()`` in a background thread, at most ``depth`` items ahead of the consumer.

    Iterating yields the items in order; an exception in the producer is re-raised in the
    consumer. Closing (or dropping) the iterator stops the thread at its next hand-off.
    """

    def __init__(self, produce: Callable[[], Iterator[T]], depth: int) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, got {depth}")
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(produce,), name="flow-data-prefetch", daemon=True
        )
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, produce: Callable[[], Iterator[T]]) -> None:
        try:
            for item in produce():
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self._put(_Failure(exc))
            return
        self._put(_END)

    def __iter__(self) -> Iterator[T]:
        try:
            while True:
                item = self._queue.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                yield item  # type: ignore[misc]
        finally:
            self.close()

    def close(self) -> None:
        """Stop the producer thread and wait for it."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def _groups(items: Iterator[T], size: int) -> Iterator[list[T]]:
    while group := list(itertools.islice(items, size)):
        yield group


def _ungrouped(prefetcher: Prefetcher[list[T]]) -> Iterator[T]:
    try:
        for group in prefetcher:
            yield from group
    finally:
        prefetcher.close()


def prefetch(produce: Callable[[], Iterator[T]], depth: int, group: int = 1) -> Iterator[T]:
    """Iterate ``produce()`` through a :class:`Prefetcher` (``depth`` 0 runs it inline).

    The thread hands items over ``group`` at a time, and up to ``depth`` groups wait: one
    hand-off per group instead of per item keeps the two threads' locking off the hot path.
    """
    if depth == 0:
        return produce()
    if group < 1:
        raise ValueError(f"prefetch group must be at least 1, got {group}")
    if group == 1:
        return iter(Prefetcher(produce, depth))
    return _ungrouped(Prefetcher(lambda: _groups(produce(), group), depth))
