"""Read-only S3 mounts: an S3 prefix materialized once into a task-scoped cache directory.

One listing (``list_objects_v2``, paged) per cache; then every object is streamed to disk in
chunks (never held in memory whole) by a small thread pool, written under a temporary name and
renamed into place, so a file that exists is complete. A cache is shared by every node of the
task that runs on the same machine and guarded by a lock: the first node downloads, the others
wait and reuse it; an object already present (same size) is never downloaded again for the
task. When every object is in, a manifest is written and the files and directories are made
read-only (mode bits; see ``flow_sdk.volumes`` for how writes are refused).

S3 is reached with boto3's standard credential chain (environment, ``~/.aws``, the instance
profile on cloud nodes). ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` points it at an
S3-compatible server (path-style addressing then).

Cache layout (``cache`` below is ``<cache root>/<task id>/<digest of the URI>``)::

    cache/lock            flock: one downloader at a time
    cache/manifest.json   written last: the cache is complete
    cache/files/...       the objects, by key relative to the prefix
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from flow_sdk.aws_clients import make_client
from flow_sdk.errors import VolumeError, install_hint
from flow_sdk.spec.s3uri import S3UriError, folder_prefix, split_s3_uri

CHUNK_BYTES = 1024 * 1024
DOWNLOAD_THREADS = 8
ATTEMPTS = 3
MANIFEST = "manifest.json"
FILES = "files"
_CREDENTIAL_ERRORS = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                      "ExpiredToken", "AllAccessDisabled")
Keepalive = Callable[[], None]
Log = Callable[[str], None]


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" (the whole bucket) or ending in "/"

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        """``s3://bucket/prefix``; the prefix names a folder (a trailing ``/`` is implied)."""
        try:
            bucket, key = split_s3_uri(uri)
        except S3UriError as exc:
            raise VolumeError(str(exc)) from None
        return cls(bucket, folder_prefix(key))

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


@dataclass(frozen=True)
class S3File:
    key: str
    relative: str  # path under the mount, "/"-separated
    size: int


@dataclass(frozen=True)
class Materialized:
    """A complete cache of one S3 prefix."""

    uri: str
    directory: Path  # what the mount path shows
    objects: int
    total_bytes: int
    downloaded: int  # objects this call fetched
    reused: int  # objects already in the cache for this task
    skipped: tuple[str, ...]  # keys that cannot be files (unsafe or clashing names)


def s3_client(threads: int = DOWNLOAD_THREADS) -> Any:
    """A boto3 S3 client: standard credential chain, ``AWS_ENDPOINT_URL[_S3]`` honoured."""
    if importlib.util.find_spec("boto3") is None:
        raise VolumeError(install_hint("an S3 mount", "boto3") + " where you launch (the "
                          "nodes install the caller's versions)")
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return make_client("s3", endpoint_url=endpoint or None,
                       max_pool_connections=max(10, threads))


def _client_error(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error", {})
        return f"{error.get('Code', '')}: {error.get('Message', '')}".strip(": ") or str(exc)
    return str(exc)


def list_objects(client: Any, location: S3Location) -> list[dict[str, Any]]:
    """Every object under the prefix, in one paged listing."""
    found: list[dict[str, Any]] = []
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket,
                                                                 Prefix=location.prefix)
        for page in pages:
            found.extend(page.get("Contents", []))
    except Exception as exc:  # botocore raises ClientError, BotoCoreError and socket errors
        reason = _client_error(exc)
        hint = ""
        if reason.split(":")[0] in _CREDENTIAL_ERRORS:
            hint = (f"; the node's AWS credentials (instance profile or AWS_* environment) need "
                    f"s3:ListBucket and s3:GetObject on {location.bucket}")
        raise VolumeError(f"cannot list {location}: {reason}{hint}") from exc
    return found


def _safe_relative(relative: str) -> bool:
    parts = relative.split("/")
    return all(p not in ("", ".", "..") and "\0" not in p for p in parts)


def plan_files(objects: list[dict[str, Any]], location: S3Location
               ) -> tuple[list[S3File], list[str], list[str]]:
    """(files, directories, skipped keys) for a listing under ``location``.

    Keys ending in ``/`` are folder markers (directories). A key that cannot be a file under
    the mount (``..``, empty components, or a name that is also a folder) is skipped.
    """
    files: list[S3File] = []
    directories: set[str] = set()
    skipped: list[str] = []
    for obj in objects:
        key = obj["Key"]
        relative = key[len(location.prefix):]
        if not relative:  # the prefix's own folder marker
            continue
        if relative.endswith("/"):
            if relative.strip("/") and _safe_relative(relative.rstrip("/")):
                directories.add(relative.rstrip("/"))
            elif relative.strip("/"):
                skipped.append(key)
            continue
        if not relative or not _safe_relative(relative):
            skipped.append(key)
            continue
        files.append(S3File(key, relative, int(obj.get("Size", 0))))
    for f in files:
        directories.update(str(p) for p in PurePosixPath(f.relative).parents if str(p) != ".")
    clashing = {f.relative for f in files} & directories
    skipped.extend(f.key for f in files if f.relative in clashing)
    files = [f for f in files if f.relative not in clashing]
    return files, sorted(directories), skipped


def download(client: Any, location: S3Location, item: S3File, target: Path,
             chunk_bytes: int = CHUNK_BYTES) -> int:
    """Stream one object to ``target`` in chunks (resuming after a broken stream); the file
    appears complete or not at all. Returns its size."""
    temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
    written = 0
    try:
        with open(temp, "wb") as out:
            for attempt in range(ATTEMPTS):
                extra = {"Range": f"bytes={written}-"} if written else {}
                try:
                    body = client.get_object(Bucket=location.bucket, Key=item.key,
                                             **extra)["Body"]
                    for chunk in body.iter_chunks(chunk_bytes):
                        out.write(chunk)
                        written += len(chunk)
                    break
                except Exception as exc:  # a failed GET or a broken stream: resume, then fail
                    if attempt == ATTEMPTS - 1:
                        raise VolumeError(f"could not download s3://{location.bucket}/"
                                          f"{item.key}: {_client_error(exc)}") from exc
                    if written >= item.size:
                        break
                    time.sleep(0.2 * (attempt + 1))
        if written != item.size:
            raise VolumeError(f"s3://{location.bucket}/{item.key}: got {written} bytes, the "
                              f"listing said {item.size}; the object changed during the mount")
        os.chmod(temp, 0o444)
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)
    return written


@contextmanager
def _locked(path: Path, keepalive: Keepalive | None) -> Iterator[None]:
    with open(path, "a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if keepalive is not None:
                    keepalive()
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def set_writable(root: Path, writable: bool) -> None:
    """Make the directories under ``root`` (and ``root``) writable by the owner, or read-only
    for everyone."""
    if not root.exists():
        return
    mode = 0o755 if writable else 0o555
    folders = [root] + [Path(d) / n for d, names, _ in os.walk(root) for n in names]
    for folder in (folders if writable else reversed(folders)):
        if stat.S_ISDIR(os.lstat(folder).st_mode):
            os.chmod(folder, mode)


def materialize(uri: str, cache: Path, *, client: Any | None = None,
                keepalive: Keepalive | None = None, log: Log | None = None,
                threads: int = DOWNLOAD_THREADS, chunk_bytes: int = CHUNK_BYTES) -> Materialized:
    """Make ``cache/files`` hold every object under ``uri``; reuse what is there already.

    ``keepalive`` is called at least every half second while this waits or downloads (the
    node agent passes its heartbeat). Raises VolumeError when the prefix cannot be listed,
    holds no object, or an object cannot be downloaded.
    """
    location = S3Location.parse(uri)
    cache.mkdir(parents=True, exist_ok=True)
    files_dir = cache / FILES
    with _locked(cache / "lock", keepalive):
        manifest = cache / MANIFEST
        if manifest.exists():
            meta = json.loads(manifest.read_text())
            return Materialized(uri, files_dir, meta["objects"], meta["bytes"], 0,
                                meta["objects"], tuple(meta["skipped"]))
        set_writable(files_dir, True)  # an earlier, interrupted pass may have left it read-only
        s3 = client if client is not None else s3_client(threads)
        listing = list_objects(s3, location)
        if not listing:
            raise VolumeError(f"{location} holds no objects (or the bucket/prefix is "
                              "misspelled); nothing to mount")
        files, directories, skipped = plan_files(listing, location)
        for relative in ["", *directories]:
            (files_dir / relative).mkdir(parents=True, exist_ok=True)
        todo = [f for f in files if not _present(files_dir / f.relative, f.size)]
        if log is not None and skipped:
            log(f"mount {location}: skipped {len(skipped)} key(s) that cannot be files: "
                f"{', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''}")
        _download_all(s3, location, todo, files_dir, keepalive, threads, chunk_bytes)
        set_writable(files_dir, False)
        total = sum(f.size for f in files)
        meta = {"uri": uri, "objects": len(files), "bytes": total, "skipped": skipped,
                "completed_at": time.time()}
        temp = cache / f".{MANIFEST}.tmp"
        temp.write_text(json.dumps(meta, sort_keys=True))
        os.replace(temp, manifest)
    return Materialized(uri, files_dir, len(files), total, len(todo), len(files) - len(todo),
                        tuple(skipped))


def _present(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except FileNotFoundError:
        return False


def _download_all(client: Any, location: S3Location, todo: list[S3File], files_dir: Path,
                  keepalive: Keepalive | None, threads: int, chunk_bytes: int) -> None:
    if not todo:
        return
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="s3-mount") as pool:
        pending: set[Future[int]] = {
            pool.submit(download, client, location, f, files_dir / f.relative, chunk_bytes)
            for f in todo}
        try:
            while pending:
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_EXCEPTION)
                for future in done:
                    future.result()  # re-raises the first failure
                if keepalive is not None:
                    keepalive()
        finally:
            for future in pending:
                future.cancel()
