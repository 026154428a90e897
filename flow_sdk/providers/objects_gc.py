"""Removing finished tasks' objects from a provider's object store now (``flow gc
--older-than``), rather than when the store's own expiry (on AWS, the bucket's lifecycle rule)
gets to them.

A task is finished when its outcome record is in the store; its age counts from the outcome's
``finished_at``. A task without an outcome is running (or being launched): nothing of it is
touched, however old. Where this machine holds the task's secret (it launched the task), the
outcome's MAC must check out too, so a forged outcome cannot get a running task's objects
removed. Everything under the task's folder (record, results, errors, membership, node
records) goes, then the payloads that only removed tasks named: a payload that a remaining
task's record names stays. Payloads are shared by content, and a launch stores one only when it
is missing: a launch of the very same function and arguments whose record is not yet written
while this runs can lose its payload, and its nodes then fail the task naming it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from flow_sdk import tasksecrets, wire
from flow_sdk.wire import signing
from flow_sdk.errors import RecordError, SignatureError
from flow_sdk.wire import Outcome, TaskRecord
from flow_sdk.providers.base import ObjectStore

TASKS_FOLDER = "tasks/"


@dataclass
class ObjectsReport:
    """What ``remove_finished_tasks`` removed (with ``dry_run``: would remove) and kept."""

    dry_run: bool
    older_than_s: float
    removed_tasks: list[str] = field(default_factory=list)
    removed_objects: int = 0  # objects under the removed tasks' folders (dry run: found)
    removed_payloads: list[str] = field(default_factory=list)  # payload digests
    kept: dict[str, str] = field(default_factory=dict)  # task id -> why it stays

    def __str__(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        lines = [f"objects: {verb} {self.removed_objects} object(s) of "
                 f"{len(self.removed_tasks)} task(s) finished more than "
                 f"{self.older_than_s:g}s ago and {len(self.removed_payloads)} payload(s); "
                 f"kept {len(self.kept)} task(s)"]
        lines += [f"  removed task {task}" for task in self.removed_tasks]
        return "\n".join(lines)


def task_ids(store: ObjectStore) -> list[str]:
    """Every task that has objects in the store."""
    ids = {key[len(TASKS_FOLDER):].split("/", 1)[0] for key in store.list(TASKS_FOLDER)}
    return sorted(i for i in ids if i)


def finished_at(store: ObjectStore, task_id: str) -> tuple[float | None, str]:
    """When the task finished (None while it runs or when its outcome cannot be trusted),
    and why."""
    key = wire.outcome_key(task_id)
    raw = store.get(key)
    if raw is None:
        return None, "no outcome: running or being launched"
    try:
        if tasksecrets.has_task_secret(task_id):
            signing.open_record(tasksecrets.load_task_secret(task_id), key, raw)
        outcome = Outcome.from_json(raw)
    except (SignatureError, RecordError) as exc:
        return None, f"its outcome is not the task's own: {exc}"
    return outcome.finished_at, f"finished {outcome.status}"


def _payloads_of(store: ObjectStore, task_id: str) -> tuple[str, ...]:
    """The payloads (the call's arguments and code) the task's record names."""
    raw = store.get(wire.task_key(task_id))
    if raw is None:
        return ()
    try:
        return TaskRecord.from_json(raw).digests
    except RecordError:
        return ()


def remove_finished_tasks(store: ObjectStore, older_than_s: float, *, dry_run: bool = False,
                          now: float | None = None) -> ObjectsReport:
    """Remove the objects of tasks that finished more than ``older_than_s`` seconds before
    ``now`` (see the module docstring); with ``dry_run`` only report them."""
    now = time.time() if now is None else now
    report = ObjectsReport(dry_run, older_than_s)
    removed: set[str] = set()
    kept_payloads: set[str] = set()
    for task_id in task_ids(store):
        ended, why = finished_at(store, task_id)
        payloads = _payloads_of(store, task_id)
        if ended is None or now - ended < older_than_s:
            report.kept[task_id] = why if ended is None else f"{why} {now - ended:.0f}s ago"
            kept_payloads.update(payloads)
            continue
        report.removed_tasks.append(task_id)
        removed.update(payloads)
        prefix = wire.task_prefix(task_id)
        report.removed_objects += (len(store.list(prefix)) if dry_run
                                   else store.delete_prefix(prefix))
    for digest in sorted(removed - kept_payloads):
        key = wire.payload_key(digest)
        if dry_run:
            gone = store.exists(key)
        else:
            gone = store.delete_prefix(key) > 0
        if gone:
            report.removed_payloads.append(digest)
    return report
