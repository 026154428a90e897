"""What each page shows, read through the public API the ``flow`` command uses (``Task``,
the client's task records, ``flow_sdk.client.overview``, the volume listing). Blocking reads:
the server runs them in worker threads."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from flow_sdk.client.dashboard.lastlines import LastLines, RankLine
from flow_sdk.client.overview import PoolRow, TaskRow, pool_rows, status_data, task_row
from flow_sdk.client.records import list_client_records, load_client_record
from flow_sdk.client.stacks import Stacks, sealed_dump, task_stalls
from flow_sdk.client.task import Task
from flow_sdk.client.timeline import Timeline
from flow_sdk.errors import FlowError, RemoteTraceback
from flow_sdk.providers.base import VolumeInfo
from flow_sdk.volumes.api import list_volumes
from flow_sdk.wire.stacks import StackDump, StallRecord

TASK_LIST_LIMIT = 200


class TaskRows:
    """The task list, read again on every call, except tasks that ended: their row no
    longer changes, so it is kept."""

    def __init__(self) -> None:
        self._ended: dict[str, TaskRow] = {}

    def rows(self, app: str | None = None, status: str | None = None) -> list[TaskRow]:
        now = time.time()
        records = sorted(list_client_records(), key=lambda r: r.get("created_at", 0.0),
                         reverse=True)[:TASK_LIST_LIMIT]
        rows = []
        for record in records:
            row = self._ended.get(record["task_id"]) or task_row(record, now)
            if row.is_terminal:
                self._ended[row.task_id] = row
            rows.append(row)
        return [r for r in rows if (not app or r.app == app)
                and (not status or r.status == status)]

    def apps(self) -> list[str]:
        return sorted({r["app"] for r in list_client_records() if r.get("app")})


@dataclass(frozen=True)
class ErrorView:
    """How a task that did not succeed ended: its root cause and what followed."""

    status: str
    message: str  # the root cause, as the outcome records it
    label: str | None
    node: int | None
    rank: int | None
    exit_code: int | None
    signal_name: str | None
    consequences: list[str]
    log_tail: list[str]
    exception: str | None  # the exception ``task.result()`` raises, first line
    traceback: str | None  # its remote traceback, rendered with the caller's source


@dataclass(frozen=True)
class StallView:
    stall: StallRecord
    dumps: list[StackDump]


@dataclass(frozen=True)
class TaskState:
    """The live part of a task's page."""

    row: TaskRow
    status: dict[str, Any]  # ``overview.status_data``: nodes, outcome, stalls
    error: ErrorView | None
    stalls: list[StallView] = field(default_factory=list)
    ranks: list[RankLine] = field(default_factory=list)  # while it runs: each one's last line

    @property
    def quiet(self) -> list[RankLine]:
        """The ranks quiet for long, or named by a stall, the quietest first."""
        return sorted((r for r in self.ranks if r.quiet), key=lambda r: -r.quiet_s)

    @property
    def ended(self) -> bool:
        return self.row.is_terminal


def open_task(task_id: str) -> Task:
    """The task this machine launched; ``TaskNotFoundError`` when it knows none by that id."""
    return Task.from_id(task_id)


def task_state(task: Task, lines: LastLines | None = None) -> TaskState:
    """The task's live state; ``lines``: the page's reader of each rank's last line (kept
    between calls, so each reads only the new lines)."""
    row = task_row(load_client_record(task.task_id))
    data = status_data(task)
    error = error_view(task, data["outcome"]) if row.is_terminal else None
    stalls = stall_views(task)
    ranks: list[RankLine] = []
    if not row.is_terminal:
        stalled: dict[int, float] = {}
        for view in stalls:
            stalled.update({r: max(view.stall.at, stalled.get(r, 0.0)) for r in view.stall.ranks})
        ranks = (lines or LastLines(task)).read(time.time(), row.created_at or time.time(),
                                                stalled)
    return TaskState(row, data, error, stalls, ranks)


def error_view(task: Task, outcome: dict[str, Any] | None) -> ErrorView | None:
    if outcome is None or outcome["status"] == "SUCCEEDED":
        return None
    try:
        exc = task.error()
    except (FlowError, ImportError, AttributeError):  # its exception's class is not here
        exc = None
    cause = exc.__cause__ if exc is not None else None
    return ErrorView(outcome["status"], outcome["message"], outcome.get("label"),
                     outcome.get("node"), outcome.get("rank"), outcome.get("exit_code"),
                     outcome.get("signal_name"), list(outcome.get("consequences") or []),
                     list(outcome.get("log_tail") or []),
                     f"{type(exc).__name__}: {exc}".splitlines()[0] if exc is not None else None,
                     cause.text if isinstance(cause, RemoteTraceback) else None)


def stall_views(task: Task) -> list[StallView]:
    """The stalls the leader saw, each with the stacks it took then."""
    stalls = task_stalls(task)
    if not stalls:
        return []
    world = task.spec.world_size
    views = []
    for stall in stalls:
        found = (sealed_dump(task, stall.stacks_request, rank) for rank in range(world))
        views.append(StallView(stall, [dump for dump in found if dump is not None]))
    return views


def take_stacks(task: Task, timeout: float) -> Stacks:
    """Every worker's stacks now (``task.stacks``)."""
    return task.stacks(timeout=timeout)


def task_timeline(task: Task) -> Timeline:
    return task.timeline()


@dataclass(frozen=True)
class LogLayout:
    """What the log filters offer: the task's nodes and its workers' global ranks."""

    nodes: int
    ranks: int


def log_layout(task: Task) -> LogLayout:
    spec = task.spec
    return LogLayout(spec.num_instances, spec.world_size)


def pools() -> list[PoolRow]:
    return pool_rows()


def volume_providers() -> dict[str, dict[str, Any] | None]:
    """Providers whose volumes the page can list: ``local`` and every provider this
    machine's tasks used (with the configuration of its newest task)."""
    found: dict[str, dict[str, Any] | None] = {"local": None}
    for record in sorted(list_client_records(), key=lambda r: r.get("created_at", 0.0)):
        found[record["provider"]] = record.get("provider_config")
    return found


def volumes(provider: str) -> list[VolumeInfo]:
    """The volumes of ``provider`` (``flow volumes list --provider``)."""
    return list_volumes(provider, provider_config=volume_providers().get(provider))


def describe(exc: FlowError) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
