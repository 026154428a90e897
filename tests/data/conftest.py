"""Fixtures for the data connector tests: parquet datasets with uneven row groups, a moto S3."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest


def make_table(start: int, rows: int, seed: int = 0) -> pa.Table:
    """``rows`` rows whose ``id`` column runs from ``start``; mixed numeric columns."""
    rng = np.random.default_rng(seed + start)
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "x64": rng.standard_normal(rows),
            "x32": rng.standard_normal(rows).astype(np.float32),
            "small": (ids % 7).astype(np.int32),
            "label": (ids % 2).astype(np.int64),
        }
    )


def write_row_groups(path: Path, sizes: Sequence[int], start: int = 0) -> int:
    """Write one parquet file whose row groups have exactly ``sizes`` rows; returns the rows."""
    schema = make_table(0, 1).schema
    with pq.ParquetWriter(path, schema) as writer:
        offset = start
        for size in sizes:
            writer.write_table(make_table(offset, size), row_group_size=max(size, 1))
            offset += size
    return offset - start


def parquet_bytes(table: pa.Table, row_group_size: int | None = None) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size)
    return sink.getvalue()


@pytest.fixture
def uneven_dir(tmp_path: Path) -> tuple[Path, list[int]]:
    """A directory of three parquet files with uneven row groups (and a file to ignore)."""
    layout = [[500, 37, 1200, 3], [640], [90, 90, 2048, 1, 333]]
    root = tmp_path / "uneven"
    root.mkdir()
    start = 0
    sizes: list[int] = []
    for i, groups in enumerate(layout):
        start += write_row_groups(root / f"part-{i:02d}.parquet", groups, start)
        sizes.extend(groups)
    (root / "_SUCCESS").write_text("")
    return root, sizes


@dataclass
class MotoS3:
    """A real moto S3 server on 127.0.0.1 and a client for it."""

    endpoint_url: str
    client: Any

    def put_many(self, bucket: str, objects: dict[str, bytes]) -> None:
        """Objects straight into the server's account (it runs in this process): a thousand
        signed PUTs would only time boto3, and the reads under test go through HTTP."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        for key, body in objects.items():
            backend.put_object(bucket, key, body)


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[MotoS3]:
    """Module-scoped so the fake credentials leave the env when the module's tests end."""
    pytest.importorskip("moto.server")
    from moto.server import ThreadedMotoServer

    from flow_sdk.data._s3 import make_s3_client

    mp = pytest.MonkeyPatch()
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        mp.setenv(key, value)
    mp.delenv("AWS_PROFILE", raising=False)
    mp.delenv("AWS_ENDPOINT_URL", raising=False)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        yield MotoS3(endpoint, make_s3_client(endpoint))
    finally:
        server.stop()
        mp.undo()


@pytest.fixture
def aws_env(moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> MotoS3:
    """Fake credentials in the env for one test (the module fixture set them too)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return moto_s3


@pytest.fixture
def call_counter() -> Callable[[Any, str], dict[str, int]]:
    """Count boto3 API calls of a client by operation name, via botocore's event hooks."""

    def attach(client: Any, *operations: str) -> dict[str, int]:
        counts = {op: 0 for op in operations}
        for op in operations:

            def hook(op: str = op, **_: Any) -> None:
                counts[op] += 1

            client.meta.events.register(f"before-call.s3.{op}", hook)
        return counts

    return attach  # type: ignore[return-value]


@pytest.fixture
def table_maker() -> Callable[..., pa.Table]:
    """:func:`make_table`, for test modules."""
    return make_table


@pytest.fixture
def row_group_writer() -> Callable[..., int]:
    """:func:`write_row_groups`, for test modules."""
    return write_row_groups


@pytest.fixture
def to_parquet_bytes() -> Callable[..., bytes]:
    """:func:`parquet_bytes`, for test modules."""
    return parquet_bytes
