"""to_torch_dataset: batch sizes, seeded shuffling, every row once per epoch, DataLoader use."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from flow_sdk.data import (
    ColumnNotFoundError,
    DataConnector,
    DataSourceError,
    ShardedDataConnector,
)


def ids_of(batches: list[dict[str, torch.Tensor]]) -> np.ndarray:
    return torch.cat([b["id"] for b in batches]).numpy()


@pytest.fixture
def parquet_connector(uneven_dir: tuple[Path, list[int]]) -> DataConnector:
    return DataConnector.from_parquet(uneven_dir[0])


@pytest.fixture
def memory_connector(table_maker: Callable[..., pa.Table]) -> DataConnector:
    return DataConnector.from_arrow(table_maker(0, 150_000))


def test_is_an_iterable_dataset_of_column_dicts(parquet_connector: DataConnector) -> None:
    dataset = parquet_connector.to_torch_dataset(256, columns=["id", "x64"])
    assert isinstance(dataset, IterableDataset)
    batch = next(iter(dataset))
    assert list(batch) == ["id", "x64"]
    assert all(isinstance(t, torch.Tensor) and t.shape == (256,) for t in batch.values())


@pytest.mark.parametrize("batch_size", [1, 64, 1000, 7000])
def test_batch_sizes(parquet_connector: DataConnector, batch_size: int) -> None:
    total = parquet_connector.num_rows
    sizes = [len(b["id"]) for b in parquet_connector.to_torch_dataset(batch_size, prefetch=0)]
    full, rest = divmod(total, batch_size)
    assert sizes == [batch_size] * full + ([rest] if rest else [])
    dropped = [len(b["id"]) for b in parquet_connector.to_torch_dataset(batch_size, drop_last=True)]
    assert dropped == [batch_size] * full


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_once_per_epoch(parquet_connector: DataConnector, shuffle: bool) -> None:
    dataset = parquet_connector.to_torch_dataset(100, shuffle=shuffle, seed=3)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        ids = ids_of(list(dataset))
        assert np.array_equal(np.sort(ids), np.arange(parquet_connector.num_rows))
        if not shuffle:
            assert np.array_equal(ids, np.arange(parquet_connector.num_rows))


@pytest.mark.parametrize("fixture", ["parquet_connector", "memory_connector"])
def test_seeded_shuffle_is_reproducible_and_differs_by_seed_and_epoch(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    connector: DataConnector = request.getfixturevalue(fixture)

    def order(seed: int, epoch: int = 0, prefetch: int = 2) -> np.ndarray:
        dataset = connector.to_torch_dataset(512, shuffle=True, seed=seed, prefetch=prefetch)
        dataset.set_epoch(epoch)
        return ids_of(list(dataset))

    first = order(11)
    assert np.array_equal(first, order(11))
    assert np.array_equal(first, order(11, prefetch=0))
    assert not np.array_equal(first, order(12))
    assert not np.array_equal(first, order(11, epoch=1))
    assert not np.array_equal(first, np.sort(first))
    assert np.array_equal(np.sort(first), np.arange(connector.num_rows))


def test_shuffle_permutes_row_groups_then_rows_within_the_buffer(
    tmp_path: Path, row_group_writer: Callable[..., int]
) -> None:
    path = tmp_path / "groups.parquet"
    row_group_writer(path, [100] * 8)
    connector = DataConnector.from_parquet(path)
    dataset = connector.to_torch_dataset(100, shuffle=True, seed=5, shuffle_buffer_rows=100)
    batches = [b["id"].numpy() for b in dataset]
    # A buffer of one row group: each batch is one whole row group, rows permuted within it.
    groups = [int(b.min()) // 100 for b in batches]
    assert sorted(groups) == list(range(8)) and groups != list(range(8))
    for batch, group in zip(batches, groups, strict=True):
        assert np.array_equal(np.sort(batch), np.arange(group * 100, group * 100 + 100))
        assert not np.array_equal(batch, np.sort(batch))
    # The default buffer (at least 262,144 rows) mixes rows of different row groups.
    mixed = next(iter(connector.to_torch_dataset(100, shuffle=True, seed=5)))["id"].numpy()
    assert len({int(i) // 100 for i in mixed}) > 1


def test_shuffle_without_seed_draws_one(memory_connector: DataConnector) -> None:
    dataset = memory_connector.to_torch_dataset(1000, shuffle=True)
    assert isinstance(dataset.seed, int)
    assert np.array_equal(ids_of(list(dataset)), ids_of(list(dataset)))


def test_dataloader_with_workers_sees_every_row_once(parquet_connector: DataConnector) -> None:
    dataset = parquet_connector.to_torch_dataset(128, shuffle=True, seed=1, prefetch=0)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    ids = ids_of(list(loader))
    assert np.array_equal(np.sort(ids), np.arange(parquet_connector.num_rows))


def test_dataset_pickles_for_spawned_workers(parquet_connector: DataConnector) -> None:
    dataset = parquet_connector.to_torch_dataset(300, shuffle=True, seed=9)
    clone = pickle.loads(pickle.dumps(dataset))
    assert type(clone) is type(dataset)
    assert np.array_equal(ids_of(list(clone)), ids_of(list(dataset)))


def test_stopping_early_stops_the_prefetch_thread(memory_connector: DataConnector) -> None:
    import threading

    before = {t.ident for t in threading.enumerate()}
    iterator = iter(memory_connector.to_torch_dataset(10, prefetch=2))
    next(iterator)
    iterator.close()  # type: ignore[attr-defined]
    left = [
        t for t in threading.enumerate() if t.ident not in before and t.name == "flow-data-prefetch"
    ]
    assert not left


def test_errors_in_the_reader_reach_the_consumer(tmp_path: Path) -> None:
    path = tmp_path / "gone.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0]}), path)
    connector = DataConnector.from_parquet(path)
    path.write_bytes(b"not parquet any more")
    with pytest.raises(DataSourceError, match=r"gone\.parquet"):
        list(connector.to_torch_dataset(1, prefetch=2))


def test_sharded_torch_datasets_cover_the_data(uneven_dir: tuple[Path, list[int]]) -> None:
    sharded = ShardedDataConnector.from_parquet(uneven_dir[0])
    world_size = 3
    seen = [
        ids_of(list(sharded.get_shard(rank, world_size).to_torch_dataset(64, shuffle=True)))
        for rank in range(world_size)
    ]
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(sharded.num_rows))


def test_bad_arguments_are_rejected(memory_connector: DataConnector) -> None:
    with pytest.raises(ValueError):
        memory_connector.to_torch_dataset(0)
    with pytest.raises(ValueError):
        memory_connector.to_torch_dataset(10, prefetch=-1)
    with pytest.raises(ColumnNotFoundError, match="nope"):
        memory_connector.to_torch_dataset(10, columns=["nope"])
