"""How the caller reads a task's state from its records, its nodes' records and the provider's
instance list, and the ends it judges itself where no node reported one: past the runtime cap
with the nodes unresponsive (``capguard``), or queued by a scheduler for longer than
``availability_timeout_s`` (a Slurm job that never started: the caller then cancels it, as the
local provider gives up on GPUs other tasks hold). Reading writes nothing: ``Task.wait``
records the judged end and tears the nodes down."""

from __future__ import annotations

import time
from typing import NamedTuple, Protocol

from flow_sdk import lifecycle
from flow_sdk.client import capguard
from flow_sdk.errors import SignatureError, TaskNotFoundError
from flow_sdk.providers.base import Instance
from flow_sdk.spec import TaskSpec
from flow_sdk.wire import NodePhase, NodeRecord, Outcome, TaskRecord, TaskStatus


class _Watched(Protocol):
    task_id: str

    @property
    def spec(self) -> TaskSpec: ...

    def record(self) -> TaskRecord: ...

    def outcome(self) -> Outcome | None: ...

    def instances(self) -> list[Instance]: ...

    def nodes(self) -> list[NodeRecord]: ...


class Reading(NamedTuple):
    """One reading of a task's state."""

    status: TaskStatus
    judged: Outcome | None  # the end the caller records itself, where it judged one
    instances: list[Instance]  # as read for it (none when an outcome or the cap decided)


def judge(task: _Watched) -> Reading:
    """The task's state, and the outcome the caller records for an end no node reported that
    it judged itself; None otherwise (nodes that vanished are judged from their logs)."""
    outcome = task.outcome()
    if outcome is not None:
        return Reading(TaskStatus(outcome.status), None, [])
    late = capguard.judged(task)  # past the cap and its grace: nodes unresponsive
    if late is not None:
        return Reading(TaskStatus.TIMED_OUT, late, [])
    instances = task.instances()  # all gone, no outcome: FAILED, even after one ran
    if instances and all(i.state == "terminated" for i in instances):
        outcome = task.outcome()  # a node may have reported just before it exited
        return Reading(TaskStatus.FAILED if outcome is None else TaskStatus(outcome.status),
                       None, instances)
    if any(n.phase in (NodePhase.RUNNING, NodePhase.DONE) for n in task.nodes()):
        return Reading(TaskStatus.RUNNING, None, instances)
    unstarted = _queued_too_long(task, instances)
    if unstarted is not None:
        return Reading(TaskStatus.FAILED, unstarted, instances)
    return Reading(TaskStatus.PENDING if not instances else TaskStatus.PROVISIONING, None,
                   instances)


def _queued_too_long(task: _Watched, instances: list[Instance]) -> Outcome | None:
    """``never_started`` for nodes a scheduler queues; None for any other task, and while no
    trusted record says how long it may wait (a forged one: the nodes refuse such a task, and
    a status read must not raise)."""
    if waiting(instances) is None:
        return None
    try:
        spec = task.spec
    except (TaskNotFoundError, SignatureError):
        return None
    return never_started(spec, instances)


def waiting(instances: list[Instance]) -> str | None:
    """The reason the provider gives for the pending nodes' wait, if any (one per task: a
    job's nodes wait together)."""
    return next((i.waiting for i in instances if i.state == "pending" and i.waiting), None)


def never_started(spec: TaskSpec, instances: list[Instance], now: float | None = None
                  ) -> Outcome | None:
    """FAILED once every node has waited in a scheduler's queue for longer than
    ``availability_timeout_s``, else None."""
    why = waiting(instances)
    if why is None or any(i.state != "pending" for i in instances):
        return None
    now = time.time() if now is None else now
    waited = now - min(i.launched_at for i in instances)
    if waited < spec.availability_timeout_s:
        return None
    return lifecycle.never_started(waited, why, now)
