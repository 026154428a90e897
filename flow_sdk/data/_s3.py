"""Reading objects from S3: one LIST pass, then parallel pooled HTTP GETs with back-pressure.

The listing is done ONCE per reader with the ``list_objects_v2`` paginator and is treated as
authoritative (no per-object HEAD). Objects are then fetched through presigned GET URLs
(credentials and signing stay with boto3) by a single :class:`httpx.Client` whose connection
pool is shared by a small thread pool. A bounded read-ahead window keeps at most
``read_ahead`` objects (and ``read_ahead_bytes`` of them) in flight or fetched-but-not-consumed,
so reading never runs far ahead of the consumer, and objects come out in listing order.

boto3 is optional: it is imported when a reader is created, with a clear error if missing.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any

import httpx

from flow_sdk.aws_clients import default_region
from flow_sdk.data._errors import DataSourceError, MissingDependencyError
from flow_sdk.errors import install_hint
from flow_sdk.spec.s3uri import S3UriError, split_s3_uri

DEFAULT_READ_AHEAD = 8
DEFAULT_READ_AHEAD_BYTES = 256 << 20
_RETRY_STATUSES = frozenset({500, 502, 503, 504})
_ATTEMPTS = 3


def _import_boto3() -> tuple[ModuleType, ModuleType]:
    try:
        boto3 = importlib.import_module("boto3")
        botocore_config = importlib.import_module("botocore.config")
    except ImportError as exc:
        raise MissingDependencyError(install_hint("reading from s3://", "boto3")) from exc
    return boto3, botocore_config


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """Split ``s3://bucket/prefix`` into ``(bucket, prefix)``."""
    try:
        return split_s3_uri(uri)
    except S3UriError as exc:
        raise DataSourceError(str(exc)) from None


def make_s3_client(endpoint_url: str | None = None, *, region_name: str | None = None) -> Any:
    """Create a boto3 S3 client that signs with SigV4.

    ``endpoint_url`` (or boto3's own ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` env vars)
    points it at an S3-compatible server such as moto or MinIO; path-style addressing is used
    then, since such servers rarely resolve bucket sub-domains.
    """
    boto3, botocore_config = _import_boto3()
    custom = (
        endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    )
    s3_options = {"addressing_style": "path"} if custom else {}
    config = botocore_config.Config(
        signature_version="s3v4",
        retries={"max_attempts": 5, "mode": "standard"},
        s3=s3_options,
    )
    session = boto3.session.Session()
    return session.client(
        "s3", endpoint_url=endpoint_url, region_name=default_region(region_name), config=config
    )


@dataclass(frozen=True)
class S3Object:
    """One listed object: its key and size in bytes."""

    key: str
    size: int


@dataclass(frozen=True)
class _Fetch:
    """One GET: a whole object, or the byte range ``bytes=<range_spec>`` of ``size`` bytes."""

    obj: S3Object
    range_spec: str | None = None
    range_size: int = 0

    @property
    def size(self) -> int:
        return self.range_size if self.range_spec is not None else self.obj.size


@dataclass
class S3ReadStats:
    """Counters of one reader, for tests and tuning.

    ``max_outstanding`` is the most objects that were in flight or fetched-but-not-yet-consumed
    at one time, ``max_buffered`` the most that were fetched and waiting for the consumer;
    neither ever exceeds the reader's ``read_ahead``. ``max_outstanding_bytes`` is the largest
    listed size of the objects outstanding at one time (at most ``read_ahead_bytes``, unless a
    single object is larger).
    """

    list_calls: int = 0
    objects_listed: int = 0
    requests: int = 0
    objects_fetched: int = 0
    bytes_fetched: int = 0
    max_outstanding: int = 0
    max_buffered: int = 0
    max_outstanding_bytes: int = 0


class S3Reader:
    """List ``s3://bucket/prefix`` once, then stream its objects as ``(key, bytes)``.

    ``read_ahead`` bounds how many objects are in flight or buffered at once; it is also the
    number of fetch threads and pooled HTTP connections. ``read_ahead_bytes`` bounds their
    total listed size, so a few large objects do not pile up in memory (one object is always
    allowed, whatever its size). Pass ``client`` to use your own boto3 S3 client.
    """

    def __init__(
        self,
        uri: str,
        *,
        endpoint_url: str | None = None,
        read_ahead: int = DEFAULT_READ_AHEAD,
        read_ahead_bytes: int = DEFAULT_READ_AHEAD_BYTES,
        timeout_s: float = 60.0,
        url_expiry_s: int = 3600,
        client: Any | None = None,
    ) -> None:
        if read_ahead < 1:
            raise ValueError(f"read_ahead must be at least 1, got {read_ahead}")
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.read_ahead = read_ahead
        self.read_ahead_bytes = read_ahead_bytes
        self.url_expiry_s = url_expiry_s
        self.client = client if client is not None else make_s3_client(endpoint_url)
        self.stats = S3ReadStats()
        self._listing: list[S3Object] | None = None
        self._lock = threading.Lock()
        self._http = httpx.Client(
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=read_ahead, max_keepalive_connections=read_ahead),
        )
        self._pool = ThreadPoolExecutor(max_workers=read_ahead, thread_name_prefix="flow-s3")
        self._closed = False
        self.pid = os.getpid()
        # Release threads and sockets when the reader is dropped without close().
        self._finalizer = weakref.finalize(self, _shutdown, self._pool, self._http)

    def __enter__(self) -> S3Reader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the fetch threads and close the pooled HTTP connections."""
        self._closed = True
        if self._finalizer.detach() is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._http.close()

    def abandon(self) -> None:
        """Forget this reader in a forked child without touching the parent's threads/sockets."""
        self._closed = True
        self._finalizer.detach()

    def list_objects(self) -> list[S3Object]:
        """All objects under the prefix, in listing order; listed on the first call only.

        Folder markers (keys ending in ``/``) are left out.
        """
        if self._listing is not None:
            return self._listing
        botocore_exceptions = importlib.import_module("botocore.exceptions")
        paginator = self.client.get_paginator("list_objects_v2")
        listing: list[S3Object] = []
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
                self.stats.list_calls += 1
                for item in page.get("Contents", []):
                    if not item["Key"].endswith("/"):
                        listing.append(S3Object(item["Key"], int(item["Size"])))
        except botocore_exceptions.ClientError as exc:
            raise DataSourceError(
                f"could not list s3://{self.bucket}/{self.prefix}: {exc}; check the bucket "
                "name, the endpoint and that your credentials may list it"
            ) from exc
        self.stats.objects_listed = len(listing)
        self._listing = listing
        return listing

    def iter_objects(
        self, objects: Iterable[S3Object] | None = None
    ) -> Iterator[tuple[str, bytes]]:
        """Yield ``(key, bytes)`` for ``objects`` (default: the listing), in that order."""
        for job, data in self._fetch_ordered(
            _Fetch(obj) for obj in (self.list_objects() if objects is None else objects)
        ):
            yield job.obj.key, data

    def iter_tails(
        self, objects: Iterable[S3Object], num_bytes: int
    ) -> Iterator[tuple[S3Object, bytes]]:
        """Yield the last ``num_bytes`` bytes (or fewer) of each object, in order."""
        jobs = (
            _Fetch(obj, f"-{min(num_bytes, obj.size)}", min(num_bytes, obj.size))
            if obj.size
            else _Fetch(obj)
            for obj in objects
        )
        for job, data in self._fetch_ordered(jobs):
            yield job.obj, data

    def fetch_range(self, obj: S3Object, start: int, stop: int) -> bytes:
        """Fetch bytes ``[start, stop)`` of one object."""
        return self._get(_Fetch(obj, f"{start}-{stop - 1}", stop - start))

    def _fetch_ordered(self, jobs: Iterable[_Fetch]) -> Iterator[tuple[_Fetch, bytes]]:
        if self._closed:
            raise DataSourceError("this S3Reader is closed; create a new one")
        pending: deque[tuple[_Fetch, Future[bytes]]] = deque()
        buffered = [0]  # fetched and waiting for the consumer, in this pass

        def on_done(future: Future[bytes]) -> None:
            if future.cancelled():
                return
            with self._lock:
                buffered[0] += 1
                self.stats.max_buffered = max(self.stats.max_buffered, buffered[0])

        source = iter(jobs)
        waiting: _Fetch | None = next(source, None)  # the next job, not yet submitted
        outstanding_bytes = 0
        try:
            while True:
                while (
                    waiting is not None
                    and len(pending) < self.read_ahead
                    and (not pending or outstanding_bytes + waiting.size <= self.read_ahead_bytes)
                ):
                    future = self._pool.submit(self._get, waiting)
                    future.add_done_callback(on_done)
                    pending.append((waiting, future))
                    outstanding_bytes += waiting.size
                    with self._lock:
                        self.stats.max_outstanding = max(self.stats.max_outstanding, len(pending))
                        self.stats.max_outstanding_bytes = max(
                            self.stats.max_outstanding_bytes, outstanding_bytes
                        )
                    waiting = next(source, None)
                if not pending:
                    return
                job, future = pending.popleft()
                data = future.result()
                outstanding_bytes -= job.size
                with self._lock:
                    buffered[0] -= 1
                yield job, data
        finally:
            for _, future in pending:
                future.cancel()

    def _presign(self, key: str) -> str:
        url: str = self.client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": key},
            ExpiresIn=self.url_expiry_s,
        )
        return url

    def _get(self, job: _Fetch) -> bytes:
        url = self._presign(job.obj.key)
        headers = {"Range": f"bytes={job.range_spec}"} if job.range_spec else {}
        where = f"s3://{self.bucket}/{job.obj.key}"
        last_problem = ""
        for attempt in range(_ATTEMPTS):
            if attempt:
                time.sleep(0.2 * 2**attempt)
            try:
                response = self._http.get(url, headers=headers)
            except httpx.HTTPError as exc:
                last_problem = f"{type(exc).__name__}: {exc}"
                continue
            with self._lock:
                self.stats.requests += 1
            if response.status_code in (200, 206):
                data = response.content
                with self._lock:
                    self.stats.bytes_fetched += len(data)
                    if job.range_spec is None:
                        self.stats.objects_fetched += 1
                return data
            last_problem = f"HTTP {response.status_code}: {response.text[:300]}"
            if response.status_code not in _RETRY_STATUSES:
                break
        raise DataSourceError(
            f"could not fetch {where} ({last_problem}); check that the object exists and "
            "that your credentials may read it"
        )


def _shutdown(pool: ThreadPoolExecutor, http: httpx.Client) -> None:
    # May run in a fetch thread (the last reference can die there), so never wait on the pool.
    pool.shutdown(wait=False, cancel_futures=True)
    http.close()


def iter_s3_objects(
    uri: str,
    *,
    endpoint_url: str | None = None,
    read_ahead: int = DEFAULT_READ_AHEAD,
    read_ahead_bytes: int = DEFAULT_READ_AHEAD_BYTES,
    client: Any | None = None,
) -> Iterator[tuple[str, bytes]]:
    """List ``s3://bucket/prefix`` once and yield ``(key, bytes)`` for every object, in order.

    At most ``read_ahead`` objects (and ``read_ahead_bytes`` bytes, or one larger object) are
    in flight or buffered at any time.
    """
    with S3Reader(
        uri,
        endpoint_url=endpoint_url,
        read_ahead=read_ahead,
        read_ahead_bytes=read_ahead_bytes,
        client=client,
    ) as reader:
        yield from reader.iter_objects()
