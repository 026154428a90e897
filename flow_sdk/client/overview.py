"""What ``flow list``, ``flow status``, ``flow pool list`` and the dashboard show of tasks and
pools, computed once here from the public records (the client's task records, ``Task``,
``Pool``), so the command line and the page never disagree."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from flow_sdk.client.pools import PoolStatus, list_pools
from flow_sdk.client.records import list_client_records, note_last_seen
from flow_sdk.client.stacks import task_stalls
from flow_sdk.client import taskstate
from flow_sdk.client.task import Task
from flow_sdk.errors import FlowError

_TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")


@dataclass(frozen=True)
class TaskRow:
    """One line of ``flow list`` (and of the dashboard's task list)."""

    task_id: str
    name: str | None
    app: str | None
    provider: str | None
    status: str  # a TaskStatus value, or "UNKNOWN (why)" when the provider could not answer
    nodes: int | None
    created_at: float | None
    elapsed_s: float | None  # from the request to the end (or to now while it runs)
    cost_so_far: float | None  # USD
    cost_per_hour: float | None  # USD per hour, all nodes
    label: str | None  # the failure's label ("user", "infra", "sdk"), if it failed
    # Set when the provider could not answer and the row is what this machine last saw of
    # the task once it ended: why it could not answer.
    last_known: str | None = None
    waiting: str | None = None  # while its nodes wait in a scheduler's queue: the reason

    @property
    def is_terminal(self) -> bool:
        return self.status in _TERMINAL


_SEEN_FIELDS = ("status", "nodes", "elapsed_s", "cost_so_far", "cost_per_hour", "label")


def task_row(record: dict[str, Any], now: float | None = None) -> TaskRow:
    """The row of the task a client record names. A provider that cannot answer gives the
    row this machine last saw once the task ended (``last_known`` says why it is not fresh),
    else ``UNKNOWN (why)``, rather than an error, so one bad provider hides no other task."""
    now = time.time() if now is None else now
    created = record.get("created_at")
    base = {"task_id": record["task_id"], "name": record.get("name"), "app": record.get("app"),
            "provider": record.get("provider"), "created_at": created}
    try:
        task = Task.from_id(record["task_id"])
        status, _, instances = taskstate.judge(task)
        waiting = None if status.is_terminal else taskstate.waiting(instances)
        outcome = task.outcome()
        nodes = task.record().spec.get("num_instances")
        end = outcome.finished_at if outcome is not None else now
        row = TaskRow(**base, status=str(status), nodes=nodes,
                      elapsed_s=max(0.0, end - created) if created else None,
                      cost_so_far=task.cost_so_far(now), cost_per_hour=task.cost_per_hour,
                      label=outcome.label if outcome is not None else None, waiting=waiting)
    except FlowError as exc:
        seen = _last_seen(record)
        if seen.get("status") not in _TERMINAL:
            return TaskRow(**base, status=f"UNKNOWN ({exc})", nodes=None, elapsed_s=None,
                           cost_so_far=None, cost_per_hour=None, label=None)
        return TaskRow(**base, **{f: seen.get(f) for f in _SEEN_FIELDS},
                       last_known=" ".join(str(exc).split()))
    seen = _last_seen(record)
    if row.is_terminal and any(seen.get(f) != getattr(row, f) for f in ("status", "nodes")):
        note_last_seen(row.task_id, {f: getattr(row, f) for f in _SEEN_FIELDS})
    return row


def _last_seen(record: dict[str, Any]) -> dict[str, Any]:
    seen = record.get("last_seen")
    return seen if isinstance(seen, dict) else {}


def task_rows(limit: int = 20, provider: str | None = None,
              now: float | None = None) -> list[TaskRow]:
    """The tasks this machine started, newest first: the newest ``limit`` (0: all), only
    ``provider``'s when given."""
    records = sorted((r for r in list_client_records()
                      if provider is None or r.get("provider") == provider),
                     key=lambda r: r.get("created_at", 0.0), reverse=True)
    if limit > 0:
        records = records[:limit]
    return [task_row(rec, now) for rec in records]


def status_data(task: Task) -> dict[str, Any]:
    """What ``flow status --json`` prints: the task, its nodes (phase, workers, state, SSH),
    its outcome and the stalls its leader saw."""
    status = task.status
    record = task.record()
    outcome = task.final_outcome()
    instances = {i.instance_id: i for i in task.instances()}
    nodes = []
    for node in sorted(task.nodes(), key=lambda n: n.node):
        instance = instances.get(node.instance_id)
        ssh = instance.ssh if instance is not None else None
        nodes.append({"node": node.node, "instance_id": node.instance_id,
                      "address": node.address, "phase": node.phase, "workers": node.workers,
                      "state": instance.state if instance is not None else "unknown",
                      "ssh": f"{ssh.user}@{ssh.host}:{ssh.port}"
                      if ssh is not None and instance is not None and instance.state == "running"
                      else None})
    waiting = None if status.is_terminal else taskstate.waiting(list(instances.values()))
    return {"task_id": task.task_id, "status": str(status), "provider": task.provider.name,
            "waiting": waiting,
            "name": record.spec.get("name"), "app": record.spec.get("app"),
            "created_at": record.created_at, "num_instances": record.spec.get("num_instances"),
            "outcome": dataclasses.asdict(outcome) if outcome is not None else None,
            "nodes": nodes, "stalls": [s.summary() for s in task_stalls(task)],
            "instances": [{"instance_id": i.instance_id, "address": i.address,
                           "state": i.state, "waiting": i.waiting or None}
                          for i in instances.values()]}


@dataclass(frozen=True)
class PoolRow:
    """One line of ``flow pool list`` (and of the dashboard's pools page)."""

    name: str
    provider: str
    state: str  # "starting", "up", "busy" (a task runs on it), "stopped"
    live_nodes: int
    node_states: dict[str, int]  # state -> how many live nodes are in it
    idle_s: float | None
    usd_per_hour: float
    stop_in_s: float | None  # seconds until its idle stop (0: due now); None: no stop set


def pool_row(pool: PoolStatus, now: float | None = None) -> PoolRow:
    now = time.time() if now is None else now
    live = [n for n in pool.nodes if n.state != "stopped"]
    states = {s: sum(n.state == s for n in live) for s in sorted({n.state for n in live})}
    busy = pool.state == "up" and pool.idle_s is None
    stop_in = None if pool.stop_at is None else max(0.0, pool.stop_at - now)
    return PoolRow(pool.name, pool.provider, "busy" if busy else pool.state, len(live), states,
                   pool.idle_s, pool.usd_per_hour, stop_in)


def pool_rows(now: float | None = None) -> list[PoolRow]:
    """Every pool this machine made, by name."""
    return [pool_row(p, now) for p in list_pools()]
