"""S3 mounts against a moto server over HTTP: multi-part objects, >1,000 keys, one listing,
chunked streaming, nothing downloaded twice for a task, clear errors."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from volumes_helpers import BIG_KEY, MANY_KEYS, MIB, s3_client_for

from flow_sdk.volumes import VolumeError
from flow_sdk.node.volumes.s3mount import S3Location, materialize, plan_files

REPO = Path(__file__).resolve().parents[2]


def _counting_client(url: str) -> tuple[Any, Counter[str]]:
    client = s3_client_for(url)
    calls: Counter[str] = Counter()
    client.meta.events.register("before-call.s3.*", lambda model, **_: calls.update([model.name]))
    return client, calls


def test_multipart_object_and_nested_keys_materialize(s3_env: str, s3_data: dict[str, Any],
                                                     tmp_path: Path) -> None:
    client, calls = _counting_client(s3_env)
    done = materialize(f"s3://{s3_data['bucket']}/mixed", tmp_path / "cache", client=client)
    assert (done.objects, done.downloaded, done.reused) == (3, 3, 0)
    big = done.directory / BIG_KEY
    assert big.stat().st_size == len(s3_data["big"]) > 10 * MIB
    assert hashlib.sha256(big.read_bytes()).digest() == hashlib.sha256(s3_data["big"]).digest()
    assert (done.directory / "nested/deeper/b.txt").read_text() == "content of nested/deeper/b.txt"
    assert calls["ListObjectsV2"] == 1 and calls["GetObject"] == 3
    # Read-only for everyone (mode bits); no partial or temporary files left behind.
    for path in done.directory.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o555 if path.is_dir() else 0o444), (path, oct(mode))
        assert not path.name.endswith(".part")


def test_more_than_1000_keys_one_listing_and_no_second_download(
        s3_env: str, s3_many_keys: str, tmp_path: Path) -> None:
    uri = s3_many_keys
    cache = tmp_path / "task-cache"
    client, calls = _counting_client(s3_env)
    first = materialize(uri, cache, client=client)
    assert first.objects == MANY_KEYS and first.downloaded == MANY_KEYS
    assert len(list(first.directory.iterdir())) == MANY_KEYS
    assert (first.directory / "part-01004.txt").read_text() == "1004\n"
    assert calls["ListObjectsV2"] == 2  # one paged listing: 1,000 + 5 keys
    assert calls["GetObject"] == MANY_KEYS
    # Another node of the same task: the complete cache is reused, S3 is not asked again.
    calls.clear()
    second = materialize(uri, cache, client=client)
    assert (second.downloaded, second.reused) == (0, MANY_KEYS)
    assert sum(calls.values()) == 0


def test_interrupted_cache_downloads_only_what_is_missing(s3_env: str, s3_data: dict[str, Any],
                                                         tmp_path: Path) -> None:
    uri = f"s3://{s3_data['bucket']}/mixed"
    cache = tmp_path / "cache"
    materialize(uri, cache, client=s3_client_for(s3_env))
    # As if the node died before finishing: no manifest, one object missing.
    (cache / "manifest.json").unlink()
    files = cache / "files"
    os.chmod(files / "nested" / "deeper", 0o755)
    (files / "nested" / "deeper" / "b.txt").unlink()
    client, calls = _counting_client(s3_env)
    again = materialize(uri, cache, client=client)
    assert (again.downloaded, again.reused) == (1, 2)
    assert calls["GetObject"] == 1
    assert (files / "nested/deeper/b.txt").read_text() == "content of nested/deeper/b.txt"


_MEASURE = """
import json, sys, tracemalloc
from pathlib import Path
from flow_sdk.node.volumes.s3mount import materialize, s3_client
client = s3_client()
client.list_buckets()  # load botocore's models before measuring
tracemalloc.start()
done = materialize(sys.argv[1], Path(sys.argv[2]), client=client)
print(json.dumps({"peak": tracemalloc.get_traced_memory()[1], "bytes": done.total_bytes}))
"""


def test_large_object_streams_without_being_held_in_memory(
        s3_env: str, s3_data: dict[str, Any], tmp_path: Path) -> None:
    # Measured in a child process: the moto server's own buffers live in this one.
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, f"s3://{s3_data['bucket']}/mixed/big",
         str(tmp_path / "cache")], capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    assert measured["bytes"] == len(s3_data["big"])
    assert measured["peak"] < 4 * MIB, f"peak {measured['peak'] / MIB:.1f} MiB for an " \
                                       f"{len(s3_data['big']) / MIB:.1f} MiB object"


def test_empty_prefix_and_missing_bucket_fail_with_the_uri(s3_env: str, s3_data: dict[str, Any],
                                                          tmp_path: Path) -> None:
    with pytest.raises(VolumeError, match=r"s3://flow-volumes-test/no-such-prefix/ holds no"):
        materialize(f"s3://{s3_data['bucket']}/no-such-prefix", tmp_path / "a",
                    client=s3_client_for(s3_env))
    with pytest.raises(VolumeError, match=r"cannot list s3://no-such-bucket-x/p/: NoSuchBucket"):
        materialize("s3://no-such-bucket-x/p", tmp_path / "b", client=s3_client_for(s3_env))
    assert not (tmp_path / "a" / "manifest.json").exists()


def test_keys_that_cannot_be_files_are_skipped_not_written_outside() -> None:
    location = S3Location.parse("s3://b/p")
    listing = [{"Key": k, "Size": 1} for k in (
        "p/ok.txt", "p/../escape", "p/a//b", "p/./c", "p/dir/", "p/x", "p/x/y", "p/")]
    files, directories, skipped = plan_files(listing, location)
    assert [f.relative for f in files] == ["ok.txt", "x/y"]
    assert directories == ["dir", "x"]
    assert sorted(skipped) == sorted(["p/../escape", "p/a//b", "p/./c", "p/x"])
    assert S3Location.parse("s3://bucket") == S3Location("bucket", "")
    assert str(S3Location.parse("s3://bucket/a/b/")) == "s3://bucket/a/b/"
