"""The file-backed object store and log store: files in a directory that the caller and the
nodes share (this machine's for the local provider; a cluster's shared filesystem for others).
A provider that keeps its objects and logs in files builds on these.

Objects and log lines are written whole or not at all (a temporary file, then a rename or a
link), in 0600 files under 0700 directories; a log stream is one file of
``<epoch seconds>\t<text>`` lines, read with a byte offset as its cursor."""

from __future__ import annotations

from pathlib import Path

from flow_sdk.providers.base import LogRecord, LogStore, LogWriter, ObjectStore, safe_part
from flow_sdk.providers.host import LOCAL, Host
from flow_sdk.wire.loglines import split_lines

MAX_EPOCH_S = 253402300800.0  # 10000-01-01: later times are no clock's


def private_dirs(folder: Path) -> None:
    """Create ``folder`` and its missing parents as 0700: other users cannot read task data."""
    LOCAL.mkdirs(str(folder))


def replace_file(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a reader (``flow logs -f`` listing a task's nodes
    while ``cancel`` marks them terminated) never sees it empty or half written."""
    LOCAL.write(str(path), text.encode())


class FileObjectStore(ObjectStore):
    """Objects as files under ``root`` on ``host`` (this machine unless given)."""

    def __init__(self, root: Path, host: Host = LOCAL) -> None:
        self.root = Path(root)
        self.host = host

    def _path(self, key: str) -> str:
        return str(self.root / safe_part(key, "object key"))

    def put(self, key: str, data: bytes) -> None:
        self.host.write(self._path(key), data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.host.write(self._path(key), data, "if_absent")

    def get(self, key: str) -> bytes | None:
        return self.host.read(self._path(key))

    def exists(self, key: str) -> bool:
        return self.host.kind(self._path(key)) == "file"

    def list(self, prefix: str) -> list[str]:
        base = self.root / safe_part(prefix.rstrip("/") or ".", "prefix")
        start = base if self.host.kind(str(base)) == "dir" else base.parent
        if start != self.root and self.root not in start.parents:
            return []  # the store's own folder is not there yet
        under = start.relative_to(self.root).as_posix()
        keys = [name if under == "." else f"{under}/{name}"
                for name in self.host.files_under(str(start))]
        return sorted(key for key in keys if key.startswith(prefix))

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list(prefix)
        base = self.root / safe_part(prefix.rstrip("/") or ".", "prefix")
        if prefix.endswith("/") and base != self.root and self.host.kind(str(base)) == "dir":
            self.host.remove(str(base))  # the folder and every key in it, in one call
            return len(keys)
        for key in keys:
            self.host.remove(self._path(key))
        return len(keys)


class _FileLogWriter(LogWriter):
    def __init__(self, host: Host, path: Path) -> None:
        self.host, self.path = host, str(path)
        host.write(self.path, b"", "append")  # the stream exists from now on

    def write(self, records: list[LogRecord]) -> None:
        if records:
            text = "".join(f"{r.ts:.6f}\t{line}\n" for r in records
                           for line in split_lines(r.text))
            self.host.write(self.path, text.encode("utf-8", errors="replace"), "append")

    def close(self) -> None:
        """Nothing is held open between writes."""


class FileLogStore(LogStore):
    """One file per stream: lines of ``<epoch seconds>\\t<text>``; the cursor is a byte offset.
    The files live under ``root`` on ``host`` (this machine unless given)."""

    def __init__(self, root: Path, host: Host = LOCAL) -> None:
        self.root = Path(root)
        self.host = host

    def stream_path(self, task_id: str, stream: str) -> Path:
        """The one file that holds a stream (a writer outside this process may append to it,
        in the same ``<epoch seconds>\t<text>`` lines)."""
        return self.root / safe_part(task_id, "task id") / f"{safe_part(stream, 'stream')}.log"

    def writer(self, task_id: str, stream: str) -> LogWriter:
        return _FileLogWriter(self.host, self.stream_path(task_id, stream))

    def streams(self, task_id: str) -> list[str]:
        names = self.host.names(str(self.root / safe_part(task_id, "task id"))) or []
        return sorted(n[: -len(".log")] for n in names if n.endswith(".log"))

    def read(self, task_id: str, stream: str, cursor: int = 0) -> tuple[list[LogRecord], int]:
        chunk = self.host.read(str(self.stream_path(task_id, stream)), cursor)
        if chunk is None:
            return [], cursor
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
