"""The file-backed object store and log store: files in a directory that the caller and the
nodes share (this machine's for the local provider; a cluster's shared filesystem for others).
A provider that keeps its objects and logs in files builds on these.

Objects and log lines are written whole or not at all (a temporary file, then a rename or a
link), in 0600 files under 0700 directories; a log stream is one file of
``<epoch seconds>\t<text>`` lines, read with a byte offset as its cursor."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import IO

from flow_sdk.providers.base import LogRecord, LogStore, LogWriter, ObjectStore, safe_part
from flow_sdk.wire.loglines import split_lines

MAX_EPOCH_S = 253402300800.0  # 10000-01-01: later times are no clock's


def private_dirs(folder: Path) -> None:
    """Create ``folder`` and its missing parents as 0700: other users cannot read task data."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir(mode=0o700, exist_ok=True)


def _private_file(path: Path, flags: int) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o600)


def _write_temp(path: Path, data: bytes) -> Path:
    """``data`` in a new private file beside ``path``."""
    private_dirs(path.parent)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    with os.fdopen(_private_file(temp, os.O_EXCL), "wb") as fh:
        fh.write(data)
    return temp


def replace_file(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a reader (``flow logs -f`` listing a task's nodes
    while ``cancel`` marks them terminated) never sees it empty or half written."""
    os.replace(_write_temp(path, text.encode()), path)


class FileObjectStore(ObjectStore):
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / safe_part(key, "object key")

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        os.replace(_write_temp(path, data), path)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        temp = _write_temp(path, data)
        try:
            os.link(temp, path)  # atomic: fails when the key exists
        except FileExistsError:
            return False
        finally:
            temp.unlink()
        return True

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def list(self, prefix: str) -> list[str]:
        base = self.root / safe_part(prefix.rstrip("/") or ".", "prefix")
        start = base if base.is_dir() else base.parent
        if not start.is_dir():
            return []
        keys = []
        for dirpath, _dirs, files in os.walk(start):
            for name in files:
                if name.startswith("."):
                    continue
                key = (Path(dirpath) / name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list(prefix)
        for key in keys:
            self._path(key).unlink(missing_ok=True)
        base = self.root / safe_part(prefix.rstrip("/") or ".", "prefix")
        if prefix.endswith("/") and base.is_dir():
            shutil.rmtree(base, ignore_errors=True)
        return len(keys)


class _FileLogWriter(LogWriter):
    def __init__(self, path: Path) -> None:
        private_dirs(path.parent)
        self._fh: IO[bytes] = os.fdopen(_private_file(path, os.O_APPEND), "ab", buffering=0)

    def write(self, records: list[LogRecord]) -> None:
        if records:
            text = "".join(f"{r.ts:.6f}\t{line}\n" for r in records
                           for line in split_lines(r.text))
            self._fh.write(text.encode("utf-8", errors="replace"))

    def close(self) -> None:
        self._fh.close()


class FileLogStore(LogStore):
    """One file per stream: lines of ``<epoch seconds>\\t<text>``; the cursor is a byte offset."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def stream_path(self, task_id: str, stream: str) -> Path:
        """The one file that holds a stream (a writer outside this process may append to it,
        in the same ``<epoch seconds>\t<text>`` lines)."""
        return self.root / safe_part(task_id, "task id") / f"{safe_part(stream, 'stream')}.log"

    def writer(self, task_id: str, stream: str) -> LogWriter:
        return _FileLogWriter(self.stream_path(task_id, stream))

    def streams(self, task_id: str) -> list[str]:
        folder = self.root / safe_part(task_id, "task id")
        if not folder.is_dir():
            return []
        return sorted(p.name[: -len(".log")] for p in folder.iterdir() if p.name.endswith(".log"))

    def read(self, task_id: str, stream: str, cursor: int = 0) -> tuple[list[LogRecord], int]:
        path = self.stream_path(task_id, stream)
        if not path.exists():
            return [], cursor
        with open(path, "rb") as fh:
            fh.seek(cursor)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1  # only whole lines; a half-written one waits
        return parse_log_lines(chunk[:end]), cursor + end


def _stamp(text: str) -> float | None:
    """The epoch seconds a record starts with, or None when it is not a time a clock shows."""
    if not 0 < len(text) <= 32:
        return None
    try:
        ts = float(text)
    except ValueError:
        return None
    return ts if 0.0 <= ts < MAX_EPOCH_S else None


def parse_log_lines(data: bytes) -> list[LogRecord]:
    """The records of whole ``<epoch seconds>\\t<text>\\n`` lines. Total: the text is
    everything after the tab, line ends other than ``\\n`` included (an older writer's
    ``\\r``); a line without a readable time keeps all of it as text, stamped with the
    time of the record before it, so no byte of a stream is lost or raises."""
    records: list[LogRecord] = []
    last = 0.0
    for raw in data.split(b"\n")[:-1]:
        line = raw.decode("utf-8", errors="replace")
        head, tab, text = line.partition("\t")
        ts = _stamp(head) if tab else None
        if ts is None:
            ts, text = last, line
        records.append(LogRecord(ts, text))
        last = ts
    return records
