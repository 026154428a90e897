"""A failed script, reported once: the user's own frames, at the user's own file, without the
SDK's frames; and the workers' copies of that traceback held back from the streamed output."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from flow_sdk.errors import RemoteTraceback, ScriptExitError

_FRAME_RE = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+)')
TRACEBACK_HEAD = "Traceback (most recent call last):"


def user_traceback(text: str, entrypoint: str, local_root: Path) -> list[str]:
    """The last traceback in ``text`` with only the frames of the shipped code (the node's
    copy of ``entrypoint`` and the files beside it), each pointing at ``local_root``."""
    lines = text.rstrip("\n").splitlines()
    starts = [i for i, line in enumerate(lines) if line == TRACEBACK_HEAD]
    if starts:
        lines = lines[starts[-1] + 1:]
    root = None
    for line in lines:
        match = _FRAME_RE.match(line)
        if match and match["file"].endswith("/" + entrypoint):
            root = match["file"][: -len(entrypoint)]
            break
    kept = [TRACEBACK_HEAD]
    keep_frame = False
    for line in lines:
        match = _FRAME_RE.match(line)
        if match:
            keep_frame = root is not None and match["file"].startswith(root)
            if keep_frame:
                assert root is not None
                line = line.replace(root, str(local_root) + "/", 1)
        elif not line.startswith("    "):
            keep_frame = True  # the exception's own lines
        if keep_frame:
            kept.append(line)
    return kept


def script_failure(exc: BaseException | None, entrypoint: str, local_root: Path
                   ) -> tuple[list[str], str, int | None]:
    """(traceback lines to print, the one-line reason, the script's exit code) of a failed
    script task; the exit code is None when the failure was not the script's own."""
    if isinstance(exc, ScriptExitError):
        return [], str(exc), exc.code
    cause = exc.__cause__ if exc is not None else None
    if isinstance(cause, RemoteTraceback) and exc is not None:
        lines = user_traceback(cause.text, entrypoint, local_root)
        return lines, f"{type(exc).__name__}: {exc}", 1
    return [], "" if exc is None else " ".join(str(exc).split()), None


class HeldTracebacks:
    """Holds each worker's traceback back from the stream until that worker prints again (a
    traceback it handled, shown after all) or the task ends (dropped when it failed: the
    failure is reported once, at the end)."""

    def __init__(self) -> None:
        self._held: dict[tuple[Any, Any], list[str]] = {}
        self._open: set[tuple[Any, Any]] = set()

    def feed(self, entry: dict[str, Any]) -> list[str]:
        """The lines to print now for one log entry (see ``Task.log_entries``)."""
        key = (entry["node"], entry["rank"])
        if entry["kind"] != "worker":
            return [entry["line"]]
        if entry["text"] == TRACEBACK_HEAD:
            out = self._held.pop(key, [])
            self._held[key] = [entry["line"]]
            self._open.add(key)
            return out
        if key in self._open:
            self._held[key].append(entry["line"])
            if not entry["text"].startswith(" "):
                self._open.discard(key)  # the exception line closes the block
            return []
        return self._held.pop(key, []) + [entry["line"]]

    def end(self, failed: bool) -> list[str]:
        """What is still held: nothing when the task failed, else every held line."""
        held = [] if failed else [line for lines in self._held.values() for line in lines]
        self._held.clear()
        self._open.clear()
        return held
