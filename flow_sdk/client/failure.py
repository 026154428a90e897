"""The exception a failed task raises in the caller: the root cause's own exception when it
pickled (its traceback rendered with the caller's source), else a ``TaskFailedError``; either
way with the failure's label and the failures it caused listed as notes."""

from __future__ import annotations

from flow_sdk import payload, tracebacks, wire
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
    lines = [f"then, as consequences ({len(outcome.consequences)}):"]
    lines += [f"  {line}" for line in shown]
    if len(outcome.consequences) > len(shown):
        lines.append(f"  ... and {len(outcome.consequences) - len(shown)} more")
    return lines


def _note(exc: BaseException, line: str) -> None:
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(line)
