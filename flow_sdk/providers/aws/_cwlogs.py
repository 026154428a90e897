"""The log store on CloudWatch Logs: a log group per task, a log stream per agent / rank.

Writing: ``write`` only buffers. A background thread ships every writer's buffer at least every
``FLUSH_INTERVAL_S`` (and ``close`` and interpreter exit flush synchronously) through
``PutLogEvents``, in batches that respect its limits: at most 10,000 events, at most 1 MiB
counting 26 bytes of overhead per event, timestamps in milliseconds, in time order, spanning at
most 24 hours. CloudWatch rejects empty messages, so an empty line is sent as one space and read
back as an empty line.

Reading: the integer cursor counts the events of the stream already returned, from its head.
The store remembers the CloudWatch forward token that ends at every cursor it handed out, so a
``follow`` loop in this process pages on from that token; a cursor it has not seen (another
process, or an evicted entry) is served by reading ``startFromHead`` and skipping that many
events. This holds because one writer owns each stream and ships it in time order.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from botocore.exceptions import BotoCoreError, ClientError

from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws._clients import error_code, error_message, tolerating
from flow_sdk.providers.base import LogRecord, LogStore, LogWriter, safe_part
from flow_sdk.wire.loglines import split_lines

MAX_BATCH_EVENTS = 10_000
MAX_BATCH_BYTES = 1_048_576
EVENT_OVERHEAD_BYTES = 26
MAX_MESSAGE_BYTES = 262_144 - EVENT_OVERHEAD_BYTES
MAX_BATCH_SPAN_MS = 24 * 3600 * 1000
FLUSH_INTERVAL_S = 0.2
MAX_PENDING_EVENTS = 200_000  # a writer that cannot ship drops its oldest lines beyond this
_TOKEN_CACHE = 4096

Event = tuple[int, str]  # (timestamp in ms, message)


def encode_message(text: str) -> str:
    """The CloudWatch message for a line: never empty, at most MAX_MESSAGE_BYTES of UTF-8."""
    if not text:
        return " "
    raw = text.encode("utf-8", errors="replace")
    if len(raw) <= MAX_MESSAGE_BYTES:
        return text
    return raw[:MAX_MESSAGE_BYTES].decode("utf-8", errors="ignore")


def decode_message(message: str) -> str:
    return "" if message == " " else message


def event_bytes(event: Event) -> int:
    return len(event[1].encode("utf-8")) + EVENT_OVERHEAD_BYTES


def batches(events: list[Event]) -> Iterator[list[Event]]:
    """``events`` in time order, cut into PutLogEvents-sized batches."""
    batch: list[Event] = []
    size = 0
    for event in sorted(events, key=lambda e: e[0]):
        cost = event_bytes(event)
        if batch and (len(batch) >= MAX_BATCH_EVENTS or size + cost > MAX_BATCH_BYTES
                      or event[0] - batch[0][0] > MAX_BATCH_SPAN_MS):
            yield batch
            batch, size = [], 0
        batch.append(event)
        size += cost
    if batch:
        yield batch


class _Flusher:
    """One daemon thread per process that ships every open writer's buffer periodically."""

    def __init__(self) -> None:
        self._writers: set[CloudWatchLogWriter] = set()  # held until closed: no line is lost
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last_report = 0.0
        atexit.register(self.flush_all)

    def register(self, writer: CloudWatchLogWriter) -> None:
        with self._lock:
            self._writers.add(writer)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="flow-cwlogs-flusher",
                                                daemon=True)
                self._thread.start()

    def unregister(self, writer: CloudWatchLogWriter) -> None:
        with self._lock:
            self._writers.discard(writer)

    def _run(self) -> None:
        while True:
            time.sleep(FLUSH_INTERVAL_S)
            self.flush_all()

    def flush_all(self) -> None:
        with self._lock:
            writers = list(self._writers)
        for writer in writers:
            try:
                writer.flush()
            except (ClientError, BotoCoreError, ProviderError) as exc:
                self._report(writer, exc)

    def _report(self, writer: CloudWatchLogWriter, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._last_report >= 10.0:  # one line per 10 s, not one per tick
            self._last_report = now
            print(f"flow: could not ship log lines to CloudWatch {writer.group}/{writer.stream}"
                  f" ({exc}); keeping them and retrying", file=sys.stderr, flush=True)


_flusher = _Flusher()


class CloudWatchLogWriter(LogWriter):
    def __init__(self, store: CloudWatchLogStore, group: str, stream: str) -> None:
        self._store = store
        self.group = group
        self.stream = stream
        self._lock = threading.Lock()  # guards the buffer
        self._send_lock = threading.Lock()  # one shipment at a time, in order
        self._pending: list[Event] = []
        self._pending_bytes = 0
        self._closed = False
        _flusher.register(self)

    def write(self, records: list[LogRecord]) -> None:
        if self._closed:
            raise ProviderError(f"log stream {self.group}/{self.stream} was closed; open a new "
                                "writer to write more lines")
        with self._lock:
            for record in records:
                for line in split_lines(record.text):  # one event per line
                    event = (int(record.ts * 1000), encode_message(line))
                    self._pending.append(event)
                    self._pending_bytes += event_bytes(event)
            overflow = len(self._pending) - MAX_PENDING_EVENTS
            if overflow > 0:
                del self._pending[:overflow]
                self._pending_bytes = sum(event_bytes(e) for e in self._pending)
                print(f"flow: dropped the {overflow} oldest unshipped log lines of "
                      f"{self.group}/{self.stream}", file=sys.stderr, flush=True)
            full = (len(self._pending) >= MAX_BATCH_EVENTS
                    or self._pending_bytes >= MAX_BATCH_BYTES)
        if full:
            self.flush()

    def flush(self) -> None:
        """Ship everything buffered now; unsent events stay buffered when this raises."""
        with self._send_lock:
            with self._lock:
                events, self._pending, self._pending_bytes = self._pending, [], 0
            if not events:
                return
            remaining = sorted(events, key=lambda e: e[0])
            try:
                for batch in batches(remaining):
                    self._store._put_events(self.group, self.stream, batch)
                    remaining = remaining[len(batch):]
            except (ClientError, BotoCoreError):
                with self._lock:
                    self._pending = remaining + self._pending
                    self._pending_bytes = sum(event_bytes(e) for e in self._pending)
                raise

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
        except (ClientError, BotoCoreError) as exc:
            raise ProviderError(f"could not ship the last log lines of {self.group}/"
                                f"{self.stream} to CloudWatch: {exc}") from exc
        finally:
            self._closed = True
            _flusher.unregister(self)


class CloudWatchLogStore(LogStore):
    # A line waits up to one flush interval in its writer's buffer, then one PutLogEvents
    # round trip before CloudWatch serves it.
    write_delay_s: ClassVar[float] = FLUSH_INTERVAL_S + 0.3

    def __init__(self, client: Callable[[], Any], group_prefix: str,
                 retention_days: int | None) -> None:
        self._client = client
        self.group_prefix = group_prefix
        self.retention_days = retention_days
        self._tokens: OrderedDict[tuple[str, str, int], str] = OrderedDict()
        self._tokens_lock = threading.Lock()

    def group(self, task_id: str) -> str:
        return self.group_prefix + safe_part(task_id, "task id")

    # -- writing ----------------------------------------------------------------------------

    def writer(self, task_id: str, stream: str) -> LogWriter:
        return CloudWatchLogWriter(self, self.group(task_id), safe_part(stream, "stream"))

    def _create_stream(self, group: str, stream: str) -> None:
        logs = self._client()
        with tolerating("ResourceAlreadyExistsException"):
            logs.create_log_group(logGroupName=group, tags={"flow:managed": "true"})
            if self.retention_days:
                logs.put_retention_policy(logGroupName=group,
                                          retentionInDays=self.retention_days)
        with tolerating("ResourceAlreadyExistsException"):
            logs.create_log_stream(logGroupName=group, logStreamName=stream)

    def _put_events(self, group: str, stream: str, batch: list[Event]) -> None:
        events = [{"timestamp": ts, "message": message} for ts, message in batch]
        logs = self._client()
        try:
            response = logs.put_log_events(logGroupName=group, logStreamName=stream,
                                           logEvents=events)
        except ClientError as exc:
            if error_code(exc) != "ResourceNotFoundException":
                raise
            self._create_stream(group, stream)
            response = logs.put_log_events(logGroupName=group, logStreamName=stream,
                                           logEvents=events)
        rejected = response.get("rejectedLogEventsInfo")
        if rejected:
            print(f"flow: CloudWatch rejected some events of {group}/{stream} as out of its "
                  f"time window: {rejected}", file=sys.stderr, flush=True)

    # -- reading ----------------------------------------------------------------------------

    def streams(self, task_id: str) -> list[str]:
        names: list[str] = []
        try:
            pages = self._client().get_paginator("describe_log_streams").paginate(
                logGroupName=self.group(task_id))
            for page in pages:
                names.extend(s["logStreamName"] for s in page.get("logStreams", []))
        except ClientError as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return []
            raise ProviderError(f"CloudWatch Logs could not list the streams of "
                                f"{self.group(task_id)}: {error_message(exc)}") from exc
        return sorted(names)

    def read(self, task_id: str, stream: str, cursor: int = 0) -> tuple[list[LogRecord], int]:
        group = self.group(task_id)
        key = (group, stream, cursor)
        with self._tokens_lock:
            token = self._tokens.get(key)
        skip = 0 if token is not None else cursor
        records: list[LogRecord] = []
        kwargs: dict[str, Any] = {"logGroupName": group, "logStreamName": stream,
                                  "startFromHead": True}
        if token is not None:
            kwargs["nextToken"] = token
        logs = self._client()
        while True:
            try:
                response = logs.get_log_events(**kwargs)
            except ClientError as exc:
                if error_code(exc) == "ResourceNotFoundException":
                    return [], cursor
                raise ProviderError(f"CloudWatch Logs could not read {group}/{stream}: "
                                    f"{error_message(exc)}") from exc
            for event in response.get("events", []):
                if skip:
                    skip -= 1
                    continue
                records.append(LogRecord(event["timestamp"] / 1000.0,
                                         decode_message(event["message"])))
            next_token = response.get("nextForwardToken")
            if next_token is None or next_token == kwargs.get("nextToken"):
                break  # the same token back: the end of the stream
            kwargs["nextToken"] = next_token
        if skip:  # the stream is shorter than the cursor (it cannot shrink): nothing new
            return [], cursor
        new_cursor = cursor + len(records)
        if kwargs.get("nextToken") is not None:
            with self._tokens_lock:
                self._tokens[(group, stream, new_cursor)] = kwargs["nextToken"]
                self._tokens.move_to_end((group, stream, new_cursor))
                while len(self._tokens) > _TOKEN_CACHE:
                    self._tokens.popitem(last=False)
        return records, new_cursor
