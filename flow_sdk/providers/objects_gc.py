"""Removing finished tasks' objects from a provider's object store now (``flow gc
--older-than``), rather than when the store's own expiry (on AWS, the bucket's lifecycle rule)
gets to them.

A task is finished when ``flow_sdk.lifecycle`` says so (``ended``: its outcome sealed with the
task's secret, which only the machine that launched it holds); its age counts from the
outcome's ``finished_at``. Any other task may be running (or being launched): nothing of it is
touched, however old, and the report says why it stays. An outcome a store writer put there
without the secret, or one this machine cannot check, never gets a task's objects removed.
Everything under the task's folder (record, results, errors, membership, node records) goes,
then the payloads that only removed tasks named: a payload that a remaining task's record names
stays. Payloads are shared by content, and a launch stores one only when it is missing: a
launch of the very same function and arguments whose record is not yet written while this runs
can lose its payload, and its nodes then fail the task naming it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from flow_sdk import wire
from flow_sdk.errors import RecordError
from flow_sdk.wire import Outcome, TaskRecord
from flow_sdk.wire.pools import pool_key
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


def _payloads_of(store: ObjectStore, task_id: str) -> tuple[str, ...] | None:
    """The payloads (the call's arguments and code) the task's record names; () for a pool
    (its tasks keep theirs in its folder); None when that cannot be known (no record, or one
    that does not parse)."""
    raw = store.get(wire.task_key(task_id))
    if raw is None:
        return () if store.exists(pool_key(task_id)) else None
    try:
        digests = TaskRecord.from_json(raw).digests
    except RecordError:
        return None
    return digests if all(isinstance(d, str) for d in digests) else None


UNCHECKED = ("no outcome sealed with a secret this machine holds: running, being launched, "
             "or launched elsewhere")


def remove_finished_tasks(store: ObjectStore, older_than_s: float,
                          ended: Callable[[str], Outcome | None], *, dry_run: bool = False,
                          now: float | None = None) -> ObjectsReport:
    """Remove the objects of tasks that finished more than ``older_than_s`` seconds before
    ``now`` (see the module docstring); with ``dry_run`` only report them. ``ended`` is
    ``flow_sdk.lifecycle``'s judgement of a task: its sealed outcome, or None while it may
    be live."""
    now = time.time() if now is None else now
    report = ObjectsReport(dry_run, older_than_s)
    removed: set[str] = set()
    kept_payloads: set[str] = set()
    unknown = False  # a task that stays names payloads no record says: keep every payload
    for task_id in task_ids(store):
        outcome = ended(task_id)
        payloads = _payloads_of(store, task_id)
        if outcome is None or now - outcome.finished_at < older_than_s:
            report.kept[task_id] = UNCHECKED if outcome is None else (
                f"finished {outcome.status} {now - outcome.finished_at:.0f}s ago")
            kept_payloads.update(payloads or ())
            unknown = unknown or payloads is None
            continue
        report.removed_tasks.append(task_id)
        removed.update(payloads or ())
        prefix = wire.task_prefix(task_id)
        report.removed_objects += (len(store.list(prefix)) if dry_run
                                   else store.delete_prefix(prefix))
    for digest in sorted(() if unknown else removed - kept_payloads):
        key = wire.payload_key(digest)
        if dry_run:
            gone = store.exists(key)
        else:
            gone = store.delete_prefix(key) > 0
        if gone:
            report.removed_payloads.append(digest)
    return report
