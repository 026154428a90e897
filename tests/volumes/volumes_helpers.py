"""Helpers and fixtures for the volume tests: loopback-only sockets, a moto S3 server over
HTTP shared by the session, fake AWS credentials in the environment (which local nodes
inherit), and a process check by FLOW_HOME.

Test modules import helpers from here, not ``from conftest import ...``: the ``conftest``
modules of directories without ``__init__.py`` share one module name, so that import reaches
whichever was loaded last. ``conftest.py`` here registers the fixtures for the directory.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from flow_testing import fake_aws_environment, moto_server, processes_with_env, wait_until


MIB = 1024 * 1024
BIG_KEY = "big/multipart.bin"
BIG_PARTS = (5 * MIB, 5 * MIB, 1 * MIB + 123)  # S3's minimum part size is 5 MiB
MANY_KEYS = 1005  # more than one ListObjectsV2 page (1,000 keys)

_real_connect = socket.socket.connect


def flow_processes(home: Path) -> list[int]:
    """PIDs of live processes (other than this one) started with ``FLOW_HOME=home``."""
    return processes_with_env("FLOW_HOME", str(home))


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    wait_until(predicate, timeout, what)


def _loopback_only(self: socket.socket, address: Any) -> None:
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = str(address[0])
        if not (host.startswith("127.") or host in ("::1", "localhost")):
            raise AssertionError(f"test tried to reach {address}: only 127.0.0.0/8 is allowed")
    _real_connect(self, address)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket.socket, "connect", _loopback_only)


@pytest.fixture(scope="session")
def moto_s3_url() -> Iterator[str]:
    with moto_server() as url:
        yield url


def s3_client_for(url: str) -> Any:
    return boto3.session.Session().client(
        "s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=16))


def big_object_bytes() -> bytes:
    """Deterministic, incompressible-looking content for the multi-part object."""
    import hashlib
    out = bytearray()
    counter = 0
    while len(out) < sum(BIG_PARTS):
        out += hashlib.sha256(counter.to_bytes(8, "big")).digest() * 64
        counter += 1
    return bytes(out[:sum(BIG_PARTS)])


@pytest.fixture()
def s3_data(moto_s3_url: str) -> dict[str, Any]:
    """One bucket with a multi-part object and two small ones under ``mixed/``, made once, and
    again when another test in this process reset moto's in-process state (``mock_aws``
    does)."""
    client = s3_client_for(moto_s3_url)
    bucket = "flow-volumes-test"
    if _holds(client, bucket, "mixed/nested/deeper/b.txt"):
        return {"bucket": bucket, "big": big_object_bytes(), "client": client}
    client.create_bucket(Bucket=bucket)
    blob = big_object_bytes()
    upload = client.create_multipart_upload(Bucket=bucket, Key=f"mixed/{BIG_KEY}")
    parts, offset = [], 0
    for number, size in enumerate(BIG_PARTS, start=1):
        part = client.upload_part(Bucket=bucket, Key=f"mixed/{BIG_KEY}", PartNumber=number,
                                  UploadId=upload["UploadId"], Body=blob[offset:offset + size])
        parts.append({"PartNumber": number, "ETag": part["ETag"]})
        offset += size
    client.complete_multipart_upload(Bucket=bucket, Key=f"mixed/{BIG_KEY}",
                                     UploadId=upload["UploadId"],
                                     MultipartUpload={"Parts": parts})
    for name in ("a.txt", "nested/deeper/b.txt"):
        client.put_object(Bucket=bucket, Key=f"mixed/{name}", Body=f"content of {name}".encode())
    return {"bucket": bucket, "big": blob, "client": client}


@pytest.fixture()
def s3_many_keys(s3_data: dict[str, Any]) -> str:
    """MANY_KEYS small objects under ``many/`` of ``s3_data``'s bucket (more than one listing
    page), put only for the tests that ask; returns their URI. They are put straight into
    the moto backend that this process's server answers from (a thousand signed requests
    over HTTP took ten seconds): what is tested is reading them back."""
    client, bucket = s3_data["client"], s3_data["bucket"]
    if not _holds(client, bucket, f"many/part-{MANY_KEYS - 1:05d}.txt"):
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
        for i in range(MANY_KEYS):
            backend.put_object(bucket, f"many/part-{i:05d}.txt", f"{i}\n".encode())
    return f"s3://{bucket}/many/"


def _holds(client: Any, bucket: str, key: str) -> bool:
    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError:
        return False
    return True


@pytest.fixture()
def s3_env(moto_s3_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Fake credentials and the moto endpoint in this process's environment (local nodes
    inherit it); returns the endpoint URL."""
    fake_aws_environment(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_s3_url)
    return moto_s3_url


@pytest.fixture(scope="session")
def literal_paths() -> bool:
    """Whether local nodes here can show mount paths literally (a private mount namespace)."""
    return private_root_supported()


_PROBE = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
ok = (libc.unshare(0x20000) == 0
      and libc.mount(None, b"/", None, ctypes.c_ulong(0x44000), None) == 0
      and libc.mount(b"flow-probe", b"/mnt", b"tmpfs", ctypes.c_ulong(0), b"size=4k") == 0)
sys.exit(0 if ok else 1)
"""


def private_root_supported() -> bool:
    """Whether a process like this one can enter a private root (tried in a child process,
    which leaves nothing behind: its namespace ends with it)."""
    if not sys.platform.startswith("linux"):
        return False
    probe = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, timeout=60,
                           check=False)
    return probe.returncode == 0
