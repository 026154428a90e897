"""The exception a failed task raises in the caller: the root cause's own exception when it
pickled (its traceback rendered with the caller's source, without the SDK's frames), else a
``TaskFailedError``; either way with the failure's label and the failures it caused listed as
notes, one line each. While the task runs, each worker's traceback is held back from the
streamed output (``HeldTracebacks``): when the task fails, the root cause's is reported once,
by the error, and its consequences' do not lead the output."""

from __future__ import annotations

from typing import Any

from flow_sdk import payload, wire
from flow_sdk.wire import tracebacks
from flow_sdk.client.tasklogs import shown, shown_lines
from flow_sdk.errors import (
    RemoteTraceback,
    TaskCancelledError,
    TaskFailedError,
    TaskTimedOutError,
)
from flow_sdk.wire import Outcome, TaskStatus
from flow_sdk.wire.signing import SignedStore

MAX_NOTED = 20  # consequences listed in the notes; the outcome keeps every one
TRACEBACK_HEAD = tracebacks.HEAD.rstrip("\n")
_CONSEQUENCES = "then, as consequences"


def task_error(store: SignedStore, task_id: str, outcome: Outcome) -> BaseException:
    """The exception that stands for ``outcome`` (a task that ended without success)."""
    status = TaskStatus(outcome.status)
    text = f"task {task_id} {status}: {shown_lines(outcome.message)}"  # it holds a log tail
    if status is TaskStatus.CANCELLED:
        return TaskCancelledError(text, task_id=task_id, status=status.value)
    if status is TaskStatus.TIMED_OUT:
        return TaskTimedOutError(text, task_id=task_id, status=status.value)
    if outcome.has_error_payload and outcome.rank is not None:
        raw = store.get_blob(wire.error_key(task_id, outcome.rank))
        if raw is not None:
            info = payload.loads(raw)
            # Rendered here, where the caller's source files are ("traceback": the node's).
            remote = (tracebacks.render(info["captured"]) if "captured" in info
                      else info["traceback"])
            where = f"raised on node {outcome.node}, rank {outcome.rank} of task {task_id}"
            exc = info.get("exception")
            if isinstance(exc, BaseException):
                _note(exc, where + _labelled(outcome))
                for line in _consequence_notes(outcome):
                    _note(exc, line)
                exc.__cause__ = RemoteTraceback(remote)
                return exc
            text = f"{info['type']}: {info['message']} ({where})\n{remote}"
    error = TaskFailedError(text + _labelled(outcome), task_id=task_id, node=outcome.node,
                            rank=outcome.rank, exit_code=outcome.exit_code,
                            signal_name=outcome.signal_name,
                            log_tail=[shown(line) for line in outcome.log_tail],
                            label=outcome.label, consequences=outcome.consequences)
    for line in _consequence_notes(outcome):
        _note(error, line)
    return error


def _labelled(outcome: Outcome) -> str:
    return f" [{outcome.label} failure]" if outcome.label else ""


def _consequence_notes(outcome: Outcome) -> list[str]:
    if not outcome.consequences:
        return []
    shown = outcome.consequences[:MAX_NOTED]
    lines = [f"{_CONSEQUENCES} ({len(outcome.consequences)}):"]
    lines += [f"  {line}" for line in shown]
    if len(outcome.consequences) > len(shown):
        lines.append(f"  ... and {len(outcome.consequences) - len(shown)} more")
    return lines


def consequence_notes(exc: BaseException) -> list[str]:
    """The notes of ``exc`` that list the failures it caused, one line each (see
    ``task_error``)."""
    notes = [str(n) for n in getattr(exc, "__notes__", [])]
    starts = [i for i, note in enumerate(notes) if note.startswith(_CONSEQUENCES)]
    return notes[starts[0]:] if starts else []


def _note(exc: BaseException, line: str) -> None:
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(line)


class HeldTracebacks:
    """Holds each worker's traceback (a chain of them, as Python prints it) back from the
    stream until that worker prints something else (a traceback it handled, shown after all)
    or the task ends (dropped when it failed: the failure is reported once, at the end)."""

    def __init__(self) -> None:
        self._held: dict[tuple[Any, Any], list[str]] = {}
        # "frames": inside a traceback; "after": its exception line came; "chain": a line
        # that joins one traceback of a chain to the next came.
        self._state: dict[tuple[Any, Any], str] = {}

    def feed(self, entry: dict[str, Any]) -> list[str]:
        """The lines to print now for one log entry (see ``Task.log_entries``)."""
        key, text, line = (entry["node"], entry["rank"]), entry["text"], entry["line"]
        if entry["kind"] != "worker":
            return [line]
        state = self._state.get(key)
        if text == TRACEBACK_HEAD:
            out = [] if state == "chain" else self._held.pop(key, [])
            self._held.setdefault(key, []).append(line)
            self._state[key] = "frames"
            return out
        if state == "frames":
            self._held[key].append(line)
            if not text.startswith(" "):
                self._state[key] = "after"  # the exception's own line
            return []
        if state in ("after", "chain") and text in tracebacks.CHAIN_LINES:
            self._held[key].append(line)
            self._state[key] = "chain"
            return []
        self._state.pop(key, None)
        return self._held.pop(key, []) + [line]

    def end(self, failed: bool) -> list[str]:
        """What is still held: nothing when the task failed, else every held line."""
        held = [] if failed else [line for lines in self._held.values() for line in lines]
        self._held.clear()
        self._state.clear()
        return held
