"""S3 reads against a real moto HTTP server: one LIST pass, pooled parallel GETs, back-pressure."""

from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from flow_sdk.data import (
    DataConnector,
    DataSourceError,
    MissingDependencyError,
    S3Reader,
    ShardedDataConnector,
    iter_s3_objects,
)
from flow_sdk.data._s3 import make_s3_client, parse_s3_uri

MANY = 1_050  # more than one 1,000-key listing page
Counter = Callable[..., dict[str, int]]


@pytest.fixture(scope="module")
def many_objects(moto_s3: Any) -> dict[str, bytes]:
    moto_s3.client.create_bucket(Bucket="many-objects")
    objects = {f"many/obj-{i:05d}.bin": f"payload {i} ".encode() * (i % 5 + 1) for i in range(MANY)}
    objects["many/sub/with space+plus.bin"] = b"odd key"
    moto_s3.put_many("many-objects", objects)
    return objects


def test_lists_once_then_fetches_everything_in_order(
    aws_env: Any, many_objects: dict[str, bytes], call_counter: Counter
) -> None:
    client = make_s3_client(aws_env.endpoint_url)
    calls = call_counter(client, "ListObjectsV2", "HeadObject", "GetObject")
    with S3Reader("s3://many-objects/many/", client=client, read_ahead=16) as reader:
        listing = reader.list_objects()
        assert reader.list_objects() is listing  # cached: never listed again
        results = list(reader.iter_objects())
    expected_keys = sorted(many_objects)
    assert [key for key, _ in results] == expected_keys  # listing order
    assert all(data == many_objects[key] for key, data in results)
    # One LIST pass: two pages for 1,051 keys, and nothing else through boto3.
    assert calls == {"ListObjectsV2": 2, "HeadObject": 0, "GetObject": 0}
    assert reader.stats.list_calls == 2
    assert reader.stats.objects_fetched == reader.stats.requests == len(expected_keys)
    assert reader.stats.bytes_fetched == sum(len(v) for v in many_objects.values())
    assert reader.stats.max_outstanding <= 16


def test_read_ahead_is_bounded_with_a_slow_consumer(
    aws_env: Any, many_objects: dict[str, bytes]
) -> None:
    bound = 4
    with S3Reader(
        "s3://many-objects/many/obj-000", endpoint_url=aws_env.endpoint_url, read_ahead=bound
    ) as reader:
        started: list[int] = []
        original = reader._get

        def spy(job: Any) -> bytes:
            started.append(int(job.obj.key[-9:-4]))
            return original(job)

        reader._get = spy  # type: ignore[method-assign]
        consumed = 0
        for index, (key, _) in enumerate(reader.iter_objects()):
            assert key == f"many/obj-{index:05d}.bin"
            # Never started more than `bound` objects past the one being consumed.
            assert max(started) < consumed + bound
            time.sleep(0.01)  # a slow consumer: fetches finish and wait in the buffer
            consumed += 1
    assert consumed == 100
    assert reader.stats.max_outstanding == bound
    assert 1 <= reader.stats.max_buffered <= bound


def test_read_ahead_is_bounded_in_bytes_too(aws_env: Any, many_objects: dict[str, bytes]) -> None:
    with S3Reader(
        "s3://many-objects/many/obj-0001",
        endpoint_url=aws_env.endpoint_url,
        read_ahead=8,
        read_ahead_bytes=100,
    ) as reader:
        got = [key for key, _ in reader.iter_objects()]
        sizes = [obj.size for obj in reader.list_objects()]
    assert got == [f"many/obj-{i:05d}.bin" for i in range(10, 20)]
    assert max(sizes) <= 100 < sum(sizes[:4])  # sizes 11..55: at most 3 fit in 100 bytes
    assert 2 <= reader.stats.max_outstanding <= 3
    assert reader.stats.max_outstanding_bytes <= 100


def test_iter_s3_objects_with_endpoint_from_env(
    aws_env: Any, many_objects: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws_env.endpoint_url)
    got = list(iter_s3_objects("s3://many-objects/many/sub/", read_ahead=2))
    assert got == [("many/sub/with space+plus.bin", b"odd key")]


def _upload_dataset(
    moto_s3: Any,
    bucket: str,
    table_maker: Callable[..., pa.Table],
    to_parquet_bytes: Callable[..., bytes],
) -> int:
    moto_s3.client.create_bucket(Bucket=bucket)
    objects: dict[str, bytes] = {}
    start = 0
    for i, rows in enumerate([700, 1_300, 90, 2_000]):
        objects[f"train/part-{i}.parquet"] = to_parquet_bytes(
            table_maker(start, rows), row_group_size=400
        )
        start += rows
    objects["train/_SUCCESS"] = b""
    objects["train-other/part-0.parquet"] = to_parquet_bytes(table_maker(10**6, 5))
    moto_s3.put_many(bucket, objects)
    return start


def test_from_parquet_on_s3(
    aws_env: Any,
    table_maker: Callable[..., pa.Table],
    to_parquet_bytes: Callable[..., bytes],
    call_counter: Counter,
) -> None:
    total = _upload_dataset(aws_env, "pq-data", table_maker, to_parquet_bytes)
    client = make_s3_client(aws_env.endpoint_url)
    calls = call_counter(client, "ListObjectsV2", "HeadObject", "GetObject")
    connector = DataConnector.from_parquet("s3://pq-data/train", s3_client=client)
    # num_rows from footers alone: one LIST, one ranged GET per file, no data read.
    assert connector.num_rows == total
    stats = connector._source._reader.stats  # type: ignore[attr-defined]
    assert stats.requests == 4 and stats.objects_fetched == 0
    table = connector.to_arrow()
    assert np.array_equal(table.column("id").to_numpy(), np.arange(total))
    assert stats.objects_fetched == 4
    assert calls == {"ListObjectsV2": 1, "HeadObject": 0, "GetObject": 0}
    batch = next(iter(connector.to_torch_dataset(500)))
    assert batch["x64"].dtype.is_floating_point and len(batch["id"]) == 500


def test_s3_dataset_in_forked_dataloader_workers(
    aws_env: Any,
    table_maker: Callable[..., pa.Table],
    to_parquet_bytes: Callable[..., bytes],
) -> None:
    from torch.utils.data import DataLoader

    total = _upload_dataset(aws_env, "pq-workers", table_maker, to_parquet_bytes)
    connector = DataConnector.from_parquet(
        "s3://pq-workers/train", endpoint_url=aws_env.endpoint_url
    )
    assert connector.to_arrow().num_rows == total  # the parent's reader has live threads now
    loader = DataLoader(
        connector.to_torch_dataset(256, shuffle=True, seed=2),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,
    )
    ids = np.concatenate([batch["id"].numpy() for batch in loader])
    assert np.array_equal(np.sort(ids), np.arange(total))


def test_sharded_s3_ranks_fetch_only_their_objects(
    aws_env: Any,
    table_maker: Callable[..., pa.Table],
    to_parquet_bytes: Callable[..., bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    total = _upload_dataset(aws_env, "pq-shards", table_maker, to_parquet_bytes)
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws_env.endpoint_url)
    sharded = ShardedDataConnector.from_parquet("s3://pq-shards/train/")
    parts = []
    for rank in range(3):
        shard = sharded.get_shard(rank, 3)
        parts.append(shard.to_arrow(["id"]).column("id").to_numpy())
    assert np.array_equal(np.concatenate(parts), np.arange(total))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 400
    # Ranks fetch only the files holding their row groups: each of the 4 files once, plus
    # at most one file per cut between ranks that both need it.
    stats = sharded._source._reader.stats  # type: ignore[attr-defined]
    assert 4 <= stats.objects_fetched <= 4 + 2
    # A pickled connector (as sent to a remote worker) opens its own reader there.
    clone = pickle.loads(pickle.dumps(sharded))
    assert np.array_equal(clone.get_shard(2, 3).to_arrow(["id"]).column("id"), parts[2])


def test_large_footer_needs_a_second_ranged_get(
    aws_env: Any, to_parquet_bytes: Callable[..., bytes]
) -> None:
    wide = pa.table({f"column_with_a_long_name_{j:04d}": np.arange(30.0) for j in range(400)})
    data = to_parquet_bytes(wide, row_group_size=10)
    aws_env.client.create_bucket(Bucket="wide")
    aws_env.client.put_object(Bucket="wide", Key="w/wide.parquet", Body=data)
    connector = DataConnector.from_parquet(
        "s3://wide/w/wide.parquet", endpoint_url=aws_env.endpoint_url
    )
    stats = connector._source._reader.stats  # type: ignore[attr-defined]
    assert stats.requests == 2, "footer > 64 KiB: tail GET, then the exact footer range"
    assert connector.num_rows == 30 and connector.row_group_sizes == [10, 10, 10]
    assert connector.to_arrow().equals(wide)


def test_missing_bucket_and_no_parquet_are_clear_errors(aws_env: Any) -> None:
    with pytest.raises(DataSourceError, match="could not list"):
        DataConnector.from_parquet("s3://no-such-bucket/x", endpoint_url=aws_env.endpoint_url)
    aws_env.client.create_bucket(Bucket="empty-bucket")
    with pytest.raises(DataSourceError, match="no parquet objects"):
        DataConnector.from_parquet("s3://empty-bucket/x", endpoint_url=aws_env.endpoint_url)


def test_missing_object_is_a_clear_error(aws_env: Any) -> None:
    from flow_sdk.data import S3Object

    with (
        S3Reader("s3://empty-bucket/", endpoint_url=aws_env.endpoint_url) as reader,
        pytest.raises(DataSourceError, match="HTTP 404"),
    ):
        list(reader.iter_objects([S3Object("gone.bin", 3)]))


def test_boto3_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(MissingDependencyError, match="needs boto3: pip install boto3$"):
        make_s3_client()
    with pytest.raises(MissingDependencyError):
        DataConnector.from_parquet("s3://bucket/prefix")


def test_parse_s3_uri() -> None:
    assert parse_s3_uri("s3://bucket/a/b/") == ("bucket", "a/b/")
    assert parse_s3_uri("s3://bucket") == ("bucket", "")
    with pytest.raises(DataSourceError):
        parse_s3_uri("https://bucket/a")
