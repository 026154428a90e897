"""A remote exception's traceback as plain data: captured on the node, rendered on the caller.

A node runs the caller's functions from code objects that cloudpickle rebuilt, and newer
cloudpickle releases name their file ``<dynamic-code>``; the node has no copy of the caller's
source either. So the node keeps, per frame, the file the code came from (``payload.Call``'s
origins), the line number and the function, and the caller, which has the source, renders the
frames with its own source lines, as Python prints a traceback.
"""

from __future__ import annotations

import linecache
import traceback
from types import TracebackType
from typing import Any, TypedDict


class Captured(TypedDict):
    """One exception of a chain. ``frames``: ``[file, line, function, source line on the
    node]``, innermost last."""

    type: str
    message: str
    notes: list[str]
    frames: list[list[Any]]
    cause: Captured | None
    context: Captured | None
    suppress_context: bool


_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"
HEAD = "Traceback (most recent call last):\n"


def _frames(tb: TracebackType | None, origins: dict[tuple[str, int], str]) -> list[list[Any]]:
    frames = []
    for frame, line in traceback.walk_tb(tb):
        code = frame.f_code
        file = origins.get((code.co_name, code.co_firstlineno), code.co_filename)
        frames.append([file, line, code.co_name, linecache.getline(file, line).strip()])
    return frames


def capture(exc: BaseException, origins: dict[tuple[str, int], str]) -> Captured:
    """``exc`` and the exceptions it was raised from or during, as plain data."""
    return _capture(exc, origins, set())


def _capture(exc: BaseException, origins: dict[tuple[str, int], str],
             seen: set[int]) -> Captured:
    seen.add(id(exc))

    def chained(other: BaseException | None) -> Captured | None:
        fresh = other is not None and id(other) not in seen
        return _capture(other, origins, seen) if fresh and other is not None else None

    return Captured(type=f"{type(exc).__module__}.{type(exc).__qualname__}",
                    message=str(exc), notes=[str(n) for n in getattr(exc, "__notes__", [])],
                    frames=_frames(exc.__traceback__, origins),
                    cause=chained(exc.__cause__), context=chained(exc.__context__),
                    suppress_context=exc.__suppress_context__)


def _frame_text(file: str, line: int, function: str, node_line: str) -> str:
    source = linecache.getline(file, line).strip() or node_line
    text = f'  File "{file}", line {line}, in {function}\n'
    return text + (f"    {source}\n" if source else "")


def render(captured: Captured) -> str:
    """The traceback as Python prints it, with this machine's source lines (the node's where
    this machine has no such file)."""
    text = ""
    if captured["cause"] is not None:
        text = render(captured["cause"]) + _CAUSE
    elif captured["context"] is not None and not captured["suppress_context"]:
        text = render(captured["context"]) + _CONTEXT
    if captured["frames"]:
        text += HEAD + "".join(_frame_text(*frame) for frame in captured["frames"])
    kind = captured["type"].removeprefix("builtins.")
    text += f"{kind}: {captured['message']}\n" if captured["message"] else f"{kind}\n"
    return text + "".join(f"{note}\n" for note in captured["notes"])
