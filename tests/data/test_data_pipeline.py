"""Streaming helpers: exact re-batching and the background prefetch with grouped hand-offs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from flow_testing import wait_until

from flow_sdk.data._pipeline import align, prefetch, read_rows_for, rebatch


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "flow-data-prefetch"]


@pytest.mark.parametrize("batch_size", [1, 3, 7, 10, 64])
def test_rebatch_cuts_exact_batches_in_order(batch_size: int) -> None:
    bounds = [(0, 5), (5, 6), (6, 20), (20, 23)]
    chunks = [pa.record_batch({"x": list(range(start, stop))}) for start, stop in bounds]
    out = list(rebatch(chunks, batch_size))
    assert all(batch.num_rows == batch_size for batch in out[:-1])
    assert 0 < out[-1].num_rows <= batch_size
    assert [v for batch in out for v in batch.column("x").to_pylist()] == list(range(23))
    dropped = list(rebatch(chunks, batch_size, drop_last=True))
    assert all(batch.num_rows == batch_size for batch in dropped)
    assert len(dropped) == 23 // batch_size


@pytest.mark.parametrize("batch_size", [1, 4, 5, 8, 100])
def test_align_cuts_whole_batches_and_copies_only_straddlers(batch_size: int) -> None:
    sizes = [8, 8, 3, 8, 13, 1, 8]
    start = 0
    chunks = []
    for size in sizes:
        chunks.append(pa.record_batch({"x": pa.array(range(start, start + size), pa.int64())}))
        start += size
    out = list(align(chunks, batch_size))
    assert [v for batch in out for v in batch.column("x").to_pylist()] == list(range(start))
    assert all(batch.num_rows % batch_size == 0 for batch in out[:-1])
    assert 0 < out[-1].num_rows
    inputs = {chunk.column(0).buffers()[1].address for chunk in chunks}
    for batch in out:
        column = batch.column(0)
        shared = column.buffers()[1].address in inputs
        # A slice of one input shares its buffer; only a concatenation (a straddler of
        # exactly one batch, or the short tail) owns new memory.
        assert shared or batch.num_rows == batch_size or batch is out[-1]


def test_read_rows_are_whole_batches_and_at_least_four_of_them() -> None:
    for batch_size in (1, 100, 4096, 65_536, 100_000):
        rows = read_rows_for(batch_size)
        assert rows % batch_size == 0
        assert rows >= max(65_536, 4 * batch_size)


@pytest.mark.parametrize(("depth", "group"), [(0, 1), (1, 1), (2, 1), (1, 4), (3, 16), (2, 100)])
def test_prefetch_yields_every_item_in_order(depth: int, group: int) -> None:
    assert list(prefetch(lambda: iter(range(37)), depth, group)) == list(range(37))


def test_grouped_prefetch_runs_at_most_depth_groups_ahead() -> None:
    produced: list[int] = []

    def produce() -> Iterator[int]:
        for item in range(40):
            produced.append(item)
            yield item

    iterator = prefetch(produce, 1, 4)
    assert next(iterator) == 0
    # Taken: group 0-3. Queued: one group (depth 1). Held by the blocked producer: one more.
    wait_until(lambda: len(produced) >= 12, 5, "the producer to fill its bound")
    time.sleep(0.2)
    assert len(produced) == 12
    assert [next(iterator) for _ in range(39)] == list(range(1, 40))


def test_producer_errors_reach_the_consumer_after_the_items_before_them() -> None:
    def produce() -> Iterator[int]:
        yield 1
        yield 2
        raise RuntimeError("decode failed")

    iterator = prefetch(produce, 2, 1)
    assert [next(iterator), next(iterator)] == [1, 2]
    with pytest.raises(RuntimeError, match="decode failed"):
        next(iterator)
    with pytest.raises(RuntimeError, match="decode failed"):
        list(prefetch(produce, 2, 8))


def test_closing_early_stops_the_thread() -> None:
    before = set(prefetch_threads())
    iterator = prefetch(lambda: iter(range(10_000)), 2, 8)
    assert next(iterator) == 0
    iterator.close()  # type: ignore[attr-defined]
    assert not set(prefetch_threads()) - before


def test_bad_prefetch_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="group"):
        prefetch(lambda: iter(()), 2, 0)
    with pytest.raises(ValueError, match="depth"):
        list(prefetch(lambda: iter(()), -1, 1))
