"""Tracebacks and stacks as plain data: captured on the node, rendered on the caller, by one
renderer.

A node runs the caller's functions from code objects that cloudpickle rebuilt, and newer
cloudpickle releases name their file ``<dynamic-code>``; the node has no copy of the caller's
source either. So the node keeps, per frame, the file the code came from (``payload.Call``'s
origins, mapped by ``caller_file``), the line number, the function, the source line as the
node reads it and whether the frame is the SDK's own; the caller, which has the source, renders
the frames with its own source lines, as Python prints a traceback. A raised exception's
traceback and a worker's stacks (``flow stacks``, a stall) are the same frames and read the
same. The SDK's frames (the runner that calls the user's function, and any SDK code between
user frames) are left out of what is shown, with a line that says how many.
"""

from __future__ import annotations

import json
import linecache
import os
import traceback
from collections.abc import Collection, Sequence
from types import TracebackType
from typing import Any, Protocol, TypedDict

Frame = list[Any]
"""``[file, line, function, source line on the node, the SDK's own frame]``."""
Origins = dict[tuple[str, int], str]
"""(function name, first line) -> the caller's file (``payload.CodeOrigins``)."""


class Captured(TypedDict):
    """One exception of a chain. ``frames``: ``Frame`` lists, innermost last."""

    type: str
    message: str
    notes: list[str]
    frames: list[Frame]
    cause: Captured | None
    context: Captured | None
    suppress_context: bool


class Stack(Protocol):
    """What a worker's stacks show (``wire.stacks.StackDump``)."""

    @property
    def rank(self) -> int: ...

    @property
    def node(self) -> int: ...

    @property
    def text(self) -> str: ...

    @property
    def how(self) -> str: ...

    @property
    def threads(self) -> list[list[Frame]]: ...

    @property
    def native(self) -> str: ...


_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"
HEAD = "Traceback (most recent call last):\n"
CHAIN_LINES = ("", _CAUSE.strip(), _CONTEXT.strip())  # what joins the tracebacks of a chain
_SDK_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # flow_sdk/
_RUNPY = ("<frozen runpy>", os.path.join("", "runpy.py"))


def caller_file(origins: Origins, file: str, function: str, line: int,
                first_line: int | None = None) -> str:
    """The caller's file of a frame's code: looked up by its function and first line for
    code shipped by value. A stack's frame names no first line: a frame in code without a
    real file (``<dynamic-code>``) takes the code of that name that starts last at or before
    ``line``. Any other frame keeps ``file``."""
    if first_line is not None:
        return origins.get((function, first_line), file)
    if not file.startswith("<"):
        return file
    starts = [first for name, first in origins if name == function and first <= line]
    return origins[(function, max(starts))] if starts else file


def _sdk_flags(files: list[str]) -> list[bool]:
    """Which frames (outermost first) are the SDK's: its own files, and the frames of the
    runner (``runpy``) that the SDK's leading frames call to run a script."""
    flags = [f.startswith(_SDK_DIR) for f in files]
    for i, file in enumerate(files):
        if not (flags[i] or file.endswith(_RUNPY)):
            break
        flags[i] = True
    return flags


def frames(raw: Sequence[tuple[str, int, str, int | None]], origins: Origins) -> list[Frame]:
    """``(file, line, function, first line or None)`` outermost first, as ``Frame`` lists:
    the caller's file, this machine's source line, the SDK's frames marked."""
    files = [caller_file(origins, file, function, line, first)
             for file, line, function, first in raw]
    return [[file, line, function, linecache.getline(file, line).strip(), sdk]
            for file, (_, line, function, _), sdk in zip(files, raw, _sdk_flags(files))]


def capture(exc: BaseException, origins: Origins) -> Captured:
    """``exc`` and the exceptions it was raised from or during, as plain data."""
    return _capture(exc, origins, set())


def _walked(tb: TracebackType | None) -> list[tuple[str, int, str, int | None]]:
    return [(frame.f_code.co_filename, line, frame.f_code.co_name, frame.f_code.co_firstlineno)
            for frame, line in traceback.walk_tb(tb)]


def _capture(exc: BaseException, origins: Origins, seen: set[int]) -> Captured:
    seen.add(id(exc))

    def chained(other: BaseException | None) -> Captured | None:
        fresh = other is not None and id(other) not in seen
        return _capture(other, origins, seen) if fresh and other is not None else None

    return Captured(type=f"{type(exc).__module__}.{type(exc).__qualname__}",
                    message=str(exc), notes=[str(n) for n in getattr(exc, "__notes__", [])],
                    frames=frames(_walked(exc.__traceback__), origins),
                    cause=chained(exc.__cause__), context=chained(exc.__context__),
                    suppress_context=exc.__suppress_context__)


def _source(frame: Frame) -> str:
    """This machine's source line of ``frame``, else the node's."""
    return linecache.getline(frame[0], frame[1]).strip() or frame[3]


def _frame_text(frame: Frame) -> str:
    source = _source(frame)
    text = f'  File "{frame[0]}", line {frame[1]}, in {frame[2]}\n'
    return text + (f"    {source}\n" if source else "")


def _shown(found: list[Frame]) -> list[Frame]:
    """The frames to show: every frame but the SDK's, unless they are all the SDK's."""
    return [f for f in found if not (len(f) > 4 and f[4])] or found


def frames_text(found: list[Frame]) -> str:
    """The frames as Python prints them, the SDK's left out (a line says how many)."""
    shown = _shown(found)
    left_out = len(found) - len(shown)
    note = (f"  ({left_out} flow-sdk frame{'' if left_out == 1 else 's'} left out)\n"
            if left_out else "")
    return note + "".join(_frame_text(f) for f in shown)


def render(captured: Captured) -> str:
    """The traceback as Python prints it, with this machine's source lines (the node's where
    this machine has no such file), without the SDK's frames."""
    text = ""
    if captured["cause"] is not None:
        text = render(captured["cause"]) + _CAUSE
    elif captured["context"] is not None and not captured["suppress_context"]:
        text = render(captured["context"]) + _CONTEXT
    if captured["frames"]:
        text += HEAD + frames_text(captured["frames"])
    kind = captured["type"].removeprefix("builtins.")
    text += f"{kind}: {captured['message']}\n" if captured["message"] else f"{kind}\n"
    return text + "".join(f"{note}\n" for note in captured["notes"])


def stack_text(stack: Stack) -> str:
    """One worker's stacks: every thread's frames as a traceback reads them (Python's main
    thread first), then py-spy's native frames where taken; the raw dump when it held no
    frames, or why there is none."""
    parts = [f"{'Main thread' if i == 0 else f'Thread {i + 1}'} (most recent call last):\n"
             + frames_text(found) for i, found in enumerate(stack.threads)]
    text = "".join(parts) or stack.text or "  (no stack)\n"
    return text.rstrip("\n") + ("\n" + stack.native.rstrip("\n") if stack.native else "")


def render_stacks(stacks: Sequence[Stack], odd: Collection[int] = ()) -> str:
    """Every rank's stacks, the ``odd`` ranks (those that stand apart) marked."""
    parts = []
    for stack in sorted(stacks, key=lambda s: s.rank):
        mark = "  <-- stands apart" if stack.rank in odd else ""
        parts.append(f"== rank {stack.rank} (node {stack.node}, {stack.how}){mark}\n"
                     + stack_text(stack))
    return "\n".join(parts)


def innermost(stack: Stack) -> str:
    """Where a rank is, in one line: the innermost frame of its main thread that is not the
    SDK's, as a traceback names it, with its source line; or why it has no stack."""
    found = _shown(stack.threads[0]) if stack.threads else []
    if not found:
        return stack.how
    file, line, function = found[-1][:3]
    source = _source(found[-1])
    return f'{function} at "{file}", line {line}' + (f": {source}" if source else "")


def origins_json(origins: Origins) -> str:
    """``origins`` as JSON (a worker hands them to its agent for its stacks)."""
    return json.dumps([[name, first, file] for (name, first), file in origins.items()])


def origins_from_json(text: str) -> Origins | None:
    """What ``origins_json`` wrote; None for anything else."""
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    if not isinstance(raw, list) or not all(
            isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and
            isinstance(e[1], int) and not isinstance(e[1], bool) and isinstance(e[2], str)
            for e in raw):
        return None
    return {(name, first): file for name, first, file in raw}
