"""The S3 object store and the CloudWatch Logs log store, against moto over HTTP."""

from __future__ import annotations

import time

import pytest
from aws_moto_world import BUCKET, AwsWorld, Recorder

from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws import AwsProvider, _cwlogs, _s3store
from flow_sdk.providers.aws._cwlogs import (
    MAX_BATCH_BYTES,
    MAX_BATCH_EVENTS,
    MAX_BATCH_SPAN_MS,
    CloudWatchLogWriter,
    batches,
    event_bytes,
)
from flow_sdk.providers.base import LogRecord

# -- S3 ------------------------------------------------------------------------------------


def test_object_store_round_trip(aws: AwsWorld) -> None:
    store = aws.provider().store
    assert store.get("tasks/a/task.json") is None and not store.exists("tasks/a/task.json")
    store.put("tasks/a/task.json", b"{}")
    store.put("tasks/a/results/000001", b"r1")
    store.put("tasks/a/results/000000", b"r0")
    store.put("tasks/ab/task.json", b"{}")
    assert store.get("tasks/a/results/000000") == b"r0" and store.exists("tasks/a/task.json")
    assert store.list("tasks/a/results/") == ["tasks/a/results/000000", "tasks/a/results/000001"]
    assert store.list("tasks/a") == ["tasks/a/results/000000", "tasks/a/results/000001",
                                     "tasks/a/task.json", "tasks/ab/task.json"]
    keys = aws.client("s3").list_objects_v2(Bucket=BUCKET)["Contents"]
    assert {k["Key"] for k in keys} >= {"flow/tasks/a/task.json"}  # under the prefix
    assert store.delete_prefix("tasks/a/") == 3
    assert store.list("tasks/") == ["tasks/ab/task.json"]


def test_put_if_absent_is_a_conditional_write(aws: AwsWorld, recorder: Recorder) -> None:
    store = aws.provider(recorder).store
    assert store.put_if_absent("tasks/a/outcome.json", b"first") is True
    assert store.put_if_absent("tasks/a/outcome.json", b"second") is False
    assert store.get("tasks/a/outcome.json") == b"first"
    assert recorder.count("s3.PutObject") == 2  # no read-then-write: If-None-Match does it


def test_delete_prefix_deletes_in_batches(aws: AwsWorld, recorder: Recorder,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_s3store, "_DELETE_BATCH", 2)  # S3's limit is 1,000 keys per request
    store = aws.provider(recorder).store
    for i in range(5):
        store.put(f"tasks/big/k{i}", b"x")
    assert store.delete_prefix("tasks/big/") == 5
    assert recorder.count("s3.DeleteObjects") == 3
    assert store.list("tasks/big/") == []


def test_unsafe_keys_are_refused(aws: AwsWorld) -> None:
    store = aws.provider().store
    for key in ("/etc/passwd", "tasks/../x", ""):
        with pytest.raises(ProviderError, match="unsafe object key"):
            store.put(key, b"x")


def test_default_bucket_is_created_private_on_first_use(aws: AwsWorld) -> None:
    config = aws.config()
    del config["bucket"]
    provider = AwsProvider.from_config(config)  # no bucket: flow-sdk-<account>-<region>
    assert provider.bucket_name() == "flow-sdk-123456789012-us-east-1"
    provider.store.put("tasks/x/task.json", b"{}")
    s3 = aws.client("s3")
    block = s3.get_public_access_block(Bucket=provider.bucket_name())
    assert all(block["PublicAccessBlockConfiguration"].values())
    assert provider.config()["bucket"] == provider.bucket_name()


# -- CloudWatch Logs -----------------------------------------------------------------------


def test_batches_respect_put_log_events_limits() -> None:
    many = [(1_000 + i, f"line {i}") for i in range(25_000)]
    cut = list(batches(many))
    assert [len(b) for b in cut] == [MAX_BATCH_EVENTS, MAX_BATCH_EVENTS, 5_000]
    big = [(1_000 + i, "x" * 200_000) for i in range(12)]
    for batch in batches(big):
        assert sum(event_bytes(e) for e in batch) <= MAX_BATCH_BYTES
    spread = [(0, "a"), (MAX_BATCH_SPAN_MS + 1, "b"), (5, "c")]
    assert [[m for _, m in b] for b in batches(spread)] == [["a", "c"], ["b"]]  # time order


def test_writer_ships_within_the_flush_interval_without_close(aws: AwsWorld) -> None:
    logs = aws.provider().logs
    writer = logs.writer("task-1", "agent.i-1")
    start = time.monotonic()
    writer.write([LogRecord(time.time(), "hello")])
    while not logs.read("task-1", "agent.i-1")[0]:
        assert time.monotonic() - start < 5.0, "the line was not shipped by the flusher"
        time.sleep(0.05)
    assert time.monotonic() - start < 2.0  # the flusher ships every 0.2 s
    writer.close()


def test_writes_are_batched_and_read_back_in_order(aws: AwsWorld, recorder: Recorder) -> None:
    provider = aws.provider(recorder)
    writer = provider.logs.writer("task-2", "node-0.rank-0")
    now = time.time()
    lines = [f"line {i}" for i in range(2_000)] + ["", "é unicode ✓"]
    for i, text in enumerate(lines):
        writer.write([LogRecord(now + i / 1e4, text)])
    writer.close()
    assert recorder.count("logs.PutLogEvents") <= 5  # 2,002 lines, a handful of requests
    records, cursor = provider.logs.read("task-2", "node-0.rank-0")
    assert [r.text for r in records] == lines  # the empty line comes back empty
    assert cursor == len(lines)
    assert abs(records[0].ts - now) < 0.002  # milliseconds
    assert provider.logs.streams("task-2") == ["node-0.rank-0"]
    [group] = aws.client("logs").describe_log_groups(logGroupNamePrefix="/flow/task-2")[
        "logGroups"]
    assert group["logGroupName"] == "/flow/task-2" and group["retentionInDays"] == 30


def test_cursor_returns_only_new_lines_in_this_and_another_process(aws: AwsWorld) -> None:
    provider = aws.provider()
    writer = provider.logs.writer("task-3", "s")
    assert isinstance(writer, CloudWatchLogWriter)
    writer.write([LogRecord(time.time(), f"a{i}") for i in range(3)])
    writer.flush()
    first, cursor = provider.logs.read("task-3", "s")
    assert [r.text for r in first] == ["a0", "a1", "a2"] and cursor == 3
    assert provider.logs.read("task-3", "s", cursor) == ([], 3)
    writer.write([LogRecord(time.time() + 1, "b0"), LogRecord(time.time() + 1, "b1")])
    writer.close()
    new, cursor2 = provider.logs.read("task-3", "s", cursor)  # from the remembered token
    assert [r.text for r in new] == ["b0", "b1"] and cursor2 == 5
    elsewhere = aws.provider().logs  # no token cache: counts events from the head
    assert [r.text for r in elsewhere.read("task-3", "s", 3)[0]] == ["b0", "b1"]
    assert elsewhere.read("task-3", "s", 5) == ([], 5)


def test_reading_what_does_not_exist_yet_is_empty(aws: AwsWorld) -> None:
    logs = aws.provider().logs
    assert logs.streams("nope") == []
    assert logs.read("nope", "agent.i-1", 7) == ([], 7)


def test_oversized_lines_are_truncated_not_rejected() -> None:
    text = "é" * 200_000  # 400,000 bytes of UTF-8
    message = _cwlogs.encode_message(text)
    assert len(message.encode()) <= _cwlogs.MAX_MESSAGE_BYTES
    assert text.startswith(message)


def test_a_closed_writer_refuses_more_lines(aws: AwsWorld) -> None:
    writer = aws.provider().logs.writer("task-4", "s")
    writer.close()
    with pytest.raises(ProviderError, match="was closed"):
        writer.write([LogRecord(time.time(), "late")])
