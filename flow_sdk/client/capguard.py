"""The caller's guard on the runtime cap: the nodes enforce ``max_run_time_hours`` themselves
(their agents, and on a cloud the node's own power-off timer), but nodes that stopped
answering (every agent frozen) enforce nothing. Past the cap and the caller's grace
(``wire.runtimecap.CALLER``), ``Task.status`` reads TIMED_OUT even without an outcome, so a
waiting caller ends: ``Task.wait`` records the outcome ``lifecycle`` gives that end (``judged``)
and tears the nodes down."""

from __future__ import annotations

import time
from typing import Protocol

from flow_sdk import lifecycle
from flow_sdk.errors import SignatureError, TaskNotFoundError
from flow_sdk.spec import TaskSpec
from flow_sdk.wire import Outcome, TaskRecord
from flow_sdk.wire.runtimecap import CALLER

_DEADLINES: dict[str, float | None] = {}  # task id -> its deadline (records never change)


class _Launched(Protocol):
    task_id: str

    def record(self) -> TaskRecord: ...


def cap_deadline(task: _Launched) -> float | None:
    """When the caller steps in (epoch seconds): launch + the cap + the grace; None without a
    cap (or while no trusted record is there)."""
    if task.task_id not in _DEADLINES:
        try:
            record = task.record()
        except (TaskNotFoundError, SignatureError):
            return None  # no (trusted) record: the nodes' own reports decide, as before
        cap_h = TaskSpec.model_validate(record.spec).max_run_time_hours
        _DEADLINES[task.task_id] = CALLER.deadline(record.created_at, cap_h)
    return _DEADLINES[task.task_id]


def overdue(deadline: float | None, now: float | None = None) -> Outcome | None:
    """The outcome to record once ``deadline`` has passed, else None."""
    now = time.time() if now is None else now
    if deadline is None or now < deadline:
        return None
    return lifecycle.cap_passed_unanswered(now)


def judged(task: _Launched) -> Outcome | None:
    """TIMED_OUT once the task's cap and its grace have passed (with no outcome recorded: the
    caller checks that first), else None."""
    return overdue(cap_deadline(task))
