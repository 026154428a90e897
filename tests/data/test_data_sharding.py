"""ShardedDataConnector: disjoint, complete, balanced within one row group; env-driven ranks."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from flow_sdk.data import DataConnector, ShardedDataConnector, ShardingError
from flow_sdk.data._sharding import (
    assign_row_groups,
    contiguous_ranges,
    even_row_ranges,
    greedy_assignment,
)
from flow_sdk.errors import FlowError


def shard_ids(connector: ShardedDataConnector, world_size: int) -> list[np.ndarray]:
    return [
        connector.get_shard(rank, world_size).to_arrow(["id"]).column("id").to_numpy()
        for rank in range(world_size)
    ]


def assert_disjoint_complete(parts: list[np.ndarray], total: int) -> None:
    joined = np.concatenate(parts) if parts else np.array([], dtype=np.int64)
    assert len(joined) == total, "every row exactly once: row count"
    assert np.array_equal(np.sort(joined), np.arange(total)), "every row exactly once: ids"


@pytest.mark.parametrize("world_size", range(1, 9))
def test_parquet_shards_disjoint_complete_balanced(
    uneven_dir: tuple[Path, list[int]], world_size: int
) -> None:
    root, sizes = uneven_dir
    sharded = ShardedDataConnector.from_parquet(root)
    assert sharded.num_rows == sum(sizes)
    assert sharded.row_group_sizes == sizes
    parts = shard_ids(sharded, world_size)
    assert_disjoint_complete(parts, sum(sizes))
    counts = [len(p) for p in parts]
    assert max(counts) - min(counts) <= max(sizes)
    # Metadata-only counts agree with what is read.
    assert sharded.shard_row_counts(world_size) == counts
    # Contiguous ranges keep order: shard r holds the rows right after shard r - 1.
    assert np.array_equal(np.concatenate(parts), np.arange(sum(sizes)))


def test_parquet_single_file_many_uneven_row_groups(
    tmp_path: Path, row_group_writer: Callable[..., int]
) -> None:
    rng = random.Random(7)
    sizes = [rng.choice([1, 5, 50, 400, 1500]) for _ in range(40)]
    path = tmp_path / "one.parquet"
    row_group_writer(path, sizes)
    sharded = ShardedDataConnector.from_parquet(path)
    assert sharded.row_group_sizes == sizes
    for world_size in range(1, 9):
        parts = shard_ids(sharded, world_size)
        assert_disjoint_complete(parts, sum(sizes))
        counts = [len(p) for p in parts]
        assert max(counts) - min(counts) <= max(sizes), (world_size, counts)


def test_fewer_row_groups_than_ranks_gives_empty_shards(
    tmp_path: Path, row_group_writer: Callable[..., int]
) -> None:
    path = tmp_path / "three.parquet"
    row_group_writer(path, [100, 80, 120])
    sharded = ShardedDataConnector.from_parquet(path)
    world_size = 8
    counts = sharded.shard_row_counts(world_size)
    assert counts.count(0) == 5
    assert sum(counts) == 300 and max(counts) - min(counts) <= 120
    parts = shard_ids(sharded, world_size)
    assert_disjoint_complete(parts, 300)
    empty = sharded.get_shard(counts.index(0), world_size)
    assert empty.num_rows == 0
    assert list(empty.iter_batches(16)) == []
    table = empty.to_arrow()
    assert table.num_rows == 0 and table.schema.names == sharded.schema.names
    assert list(empty.to_torch_dataset(16)) == []


@pytest.mark.parametrize("world_size", range(1, 9))
def test_in_memory_shards_are_even_row_ranges(
    world_size: int, table_maker: Callable[..., pa.Table]
) -> None:
    table = table_maker(0, 1003)
    for sharded in (
        ShardedDataConnector.from_arrow(table),
        ShardedDataConnector.from_pandas(table.to_pandas()),
    ):
        parts = shard_ids(sharded, world_size)
        assert_disjoint_complete(parts, 1003)
        counts = [len(p) for p in parts]
        assert max(counts) - min(counts) <= 1
        assert np.array_equal(np.concatenate(parts), np.arange(1003))


def test_in_memory_fewer_rows_than_ranks() -> None:
    sharded = ShardedDataConnector.from_pandas(pd.DataFrame({"id": [0, 1, 2]}))
    parts = shard_ids(sharded, 5)
    assert [len(p) for p in parts].count(0) == 2
    assert_disjoint_complete(parts, 3)


def test_from_connector_shards_existing_data(uneven_dir: tuple[Path, list[int]]) -> None:
    connector = DataConnector.from_parquet(uneven_dir[0])
    sharded = ShardedDataConnector.from_connector(connector)
    assert_disjoint_complete(shard_ids(sharded, 3), connector.num_rows)


def test_get_shard_reads_rank_and_world_size_from_env(
    uneven_dir: tuple[Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    sharded = ShardedDataConnector.from_parquet(uneven_dir[0])
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    from_env = sharded.get_shard().to_arrow(["id"])
    explicit = sharded.get_shard(2, 4).to_arrow(["id"])
    assert from_env.equals(explicit)


@pytest.mark.parametrize(
    ("env", "missing"),
    [({}, "RANK and WORLD_SIZE"), ({"RANK": "0"}, "WORLD_SIZE"), ({"WORLD_SIZE": "2"}, "RANK")],
)
def test_get_shard_without_env_names_the_variables(
    env: dict[str, str], missing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    sharded = ShardedDataConnector.from_arrow(pa.table({"id": [1, 2, 3]}))
    with pytest.raises(ShardingError, match=missing) as info:
        sharded.get_shard()
    assert isinstance(info.value, FlowError)
    assert "RANK" in str(info.value) and "WORLD_SIZE" in str(info.value)


@pytest.mark.parametrize(("rank", "world_size"), [(4, 4), (-1, 2), (0, 0), (1, None), (None, 2)])
def test_get_shard_rejects_bad_ranks(rank: int | None, world_size: int | None) -> None:
    sharded = ShardedDataConnector.from_arrow(pa.table({"id": [1, 2, 3]}))
    with pytest.raises(ShardingError):
        sharded.get_shard(rank, world_size)


def test_get_shard_rejects_non_integer_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "zero")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ShardingError, match="integers"):
        ShardedDataConnector.from_arrow(pa.table({"id": [1]})).get_shard()


def test_balance_rule_holds_for_random_row_groups() -> None:
    """The property behind the shard tests, over many random layouts (incl. empty groups)."""
    rng = random.Random(1234)
    for _ in range(3000):
        counts = [
            rng.choice([0, rng.randint(1, 3), rng.randint(1, 1000), rng.randint(1, 10**6)])
            for _ in range(rng.randint(0, 30))
        ]
        world_size = rng.randint(1, 12)
        biggest = max(counts, default=0)
        ranges = contiguous_ranges(counts, world_size)
        assert ranges is not None, (counts, world_size)
        assert ranges[0][0] == 0 and ranges[-1][1] == len(counts)
        assert all(ranges[r][1] == ranges[r + 1][0] for r in range(world_size - 1))
        sizes = [sum(counts[a:b]) for a, b in ranges]
        assert max(sizes) - min(sizes) <= biggest, (counts, world_size, sizes)
        greedy = greedy_assignment(counts, world_size)
        assert sorted(i for shard in greedy for i in shard) == list(range(len(counts)))
        greedy_sizes = [sum(counts[i] for i in shard) for shard in greedy]
        assert max(greedy_sizes) - min(greedy_sizes) <= biggest
        assert assign_row_groups(counts, world_size) == [list(range(a, b)) for a, b in ranges]


def test_contiguous_ranges_stay_close_to_even_split() -> None:
    assert contiguous_ranges([100] * 10, 3) == [(0, 3), (3, 7), (7, 10)]
    assert contiguous_ranges([100] * 8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert contiguous_ranges([], 3) == [(0, 0), (0, 0), (0, 0)]


def test_even_row_ranges() -> None:
    assert even_row_ranges(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert even_row_ranges(2, 4) == [(0, 0), (0, 1), (1, 1), (1, 2)]
