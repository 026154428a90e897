"""A failed script, reported once: the user's own frames, at the user's own file, without the
SDK's frames (the workers' copies of that traceback are held back from the streamed output by
``client.failure.HeldTracebacks``)."""

from __future__ import annotations

import re
from pathlib import Path

from flow_sdk.client.failure import TRACEBACK_HEAD, consequence_notes
from flow_sdk.errors import RemoteTraceback, ScriptExitError

_FRAME_RE = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+)')


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
        return lines + consequence_notes(exc), f"{type(exc).__name__}: {exc}", 1
    return [], "" if exc is None else " ".join(str(exc).split()), None
