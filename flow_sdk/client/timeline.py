"""A task's launch and run timeline, per node: read from the store, drawn as text.

``task_timeline`` reads the nodes' signed timeline records (``flow_sdk.wire.timeline``) and
adds what the client knows: when the task was requested and when the provider reports each
instance launched. ``render`` draws it (one bar per node, a legend, a table of per-phase
seconds) and ``phase_durations`` gives the figures a bench aggregates; both are pure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

from flow_sdk.errors import RecordError
from flow_sdk.providers.base import Instance
from flow_sdk.wire import LaunchRecord, TaskRecord, launch_key
from flow_sdk.wire.signing import SignedStore
from flow_sdk.wire.timeline import NodeTimeline, phase_order, timeline_key, timeline_prefix

# The character of the bar segment that ends at each phase (``requested`` is the origin).
PHASE_CHARS: dict[str, str] = {
    "instance_running": "i",
    "boot_started": "b",
    "code_installed": "c",
    "agent_up": "a",
    "joined": "j",
    "barrier_released": "r",
    "first_worker_line": "w",
    "end": "=",
}
_GENERATION_CHAR = "g"
_ID_CHARS = 12


class TaskView(Protocol):
    """What ``task_timeline`` reads of a task (``flow_sdk.client.task.Task`` has it)."""

    @property
    def task_id(self) -> str: ...
    @property
    def store(self) -> SignedStore: ...
    def record(self) -> TaskRecord: ...
    def instances(self) -> list[Instance]: ...


@dataclass(frozen=True)
class Timeline:
    """A task's nodes' timelines; every node's phases include ``requested`` and, where the
    provider still lists the instance, ``instance_running``."""

    task_id: str
    requested_at: float
    nodes: list[NodeTimeline]

    def as_dict(self) -> dict[str, Any]:
        """The timeline as JSON-ready data, with ``phase_durations``."""
        return {**asdict(self), "durations": phase_durations(self)}


def task_timeline(task: TaskView) -> Timeline:
    """The task's timeline, read now. Raises ``SignatureError`` for a forged record and
    ``RecordError`` for one this version cannot read."""
    requested_at = task.record().created_at
    found: dict[str, NodeTimeline] = {}
    for key in task.store.list(timeline_prefix(task.task_id)):
        raw = task.store.get_record(key)
        if raw is None:
            continue
        node = NodeTimeline.from_json(raw)
        if key != timeline_key(task.task_id, node.instance_id):
            raise RecordError(f"NodeTimeline: {key} holds the record of {node.instance_id}")
        found[node.instance_id] = node
    launched = _launched(task)
    nodes = []
    for instance_id in sorted(found.keys() | launched.keys()):
        node = found.get(instance_id, NodeTimeline(instance_id, None, {}))
        phases = {**node.phases, "requested": requested_at}
        if instance_id in launched:
            # a warm (pool) node was running before the task was asked for
            phases["instance_running"] = max(launched[instance_id], requested_at)
        nodes.append(NodeTimeline(instance_id, node.node, phases))
    return Timeline(task.task_id, requested_at, _sorted(nodes))


def _launched(task: TaskView) -> dict[str, float]:
    """When each instance was launched: as the provider lists it, else (an instance it no
    longer lists) as the launch record says."""
    raw = task.store.get_record(launch_key(task.task_id))
    launch = LaunchRecord.from_json(raw) if raw is not None else LaunchRecord(0.0, [])
    launched = {n.instance_id: launch.launched_at for n in launch.nodes}
    launched.update({i.instance_id: i.launched_at for i in task.instances()})
    return launched


def _sorted(nodes: list[NodeTimeline]) -> list[NodeTimeline]:
    """By rank, then instance id; nodes without a rank last."""
    return sorted(nodes, key=lambda n: (n.node is None, n.node or 0, n.instance_id))


def _steps(node: NodeTimeline) -> list[tuple[str, float]]:
    """The node's phases after ``requested``, in order, each with its time."""
    return [(p, t) for p, t in node.ordered() if p != "requested"]


def node_durations(node: NodeTimeline, origin: float) -> dict[str, float]:
    """Seconds from the node's previous phase (``requested`` at ``origin`` for the first) to
    each of its phases, in order."""
    durations: dict[str, float] = {}
    previous = origin
    for phase, at in _steps(node):
        durations[phase] = at - previous
        previous = at
    return durations


def phase_durations(timeline: Timeline) -> dict[str, list[float]]:
    """Per phase (in order), each node's seconds since its previous phase; a node that did
    not reach a phase is left out of its list."""
    found: dict[str, list[float]] = {}
    for node in _sorted(timeline.nodes):
        for phase, seconds in node_durations(node, timeline.requested_at).items():
            found.setdefault(phase, []).append(seconds)
    return {p: found[p] for p in sorted(found, key=phase_order)}


def phase_char(phase: str) -> str:
    return PHASE_CHARS.get(phase, _GENERATION_CHAR)


def render(timeline: Timeline, width: int = 60) -> str:
    """The timeline as text: one bar per node over a shared time axis from the request to
    the last phase seen, a legend, and the table of per-phase seconds."""
    nodes = _sorted(timeline.nodes)
    origin = timeline.requested_at
    if not nodes:
        return f"task {timeline.task_id}: no node timeline yet"
    last = max((t for n in nodes for _, t in _steps(n)), default=origin)
    span = last - origin if last > origin else 1.0
    lines = [f"task {timeline.task_id}: {len(nodes)} nodes, {last - origin:.1f}s from the "
             "request to the last phase seen"]
    lines += [_node_line(n, origin, span, max(width, 1)) for n in nodes]
    present = sorted({p for n in nodes for p, _ in _steps(n)}, key=phase_order)
    legend = dict.fromkeys(_legend_name(p) for p in present)
    lines += ["", "legend (each segment ends at its phase): "
              + "  ".join(f"{phase_char(p)} {p}" for p in legend), ""]
    lines += _table(nodes, present, origin)
    return "\n".join(lines)


def _legend_name(phase: str) -> str:
    return phase if phase in PHASE_CHARS else "generation_<n>"


def _label(node: NodeTimeline) -> str:
    return "?" if node.node is None else str(node.node)


def _short_id(instance_id: str) -> str:
    return instance_id if len(instance_id) <= _ID_CHARS else instance_id[:_ID_CHARS - 1] + "…"


def _node_line(node: NodeTimeline, origin: float, span: float, width: int) -> str:
    """``node 0  i-abc…  |bar|  total 12.3s``: each segment drawn with the character of the
    phase it ends at."""
    cells = [" "] * width

    def column(at: float) -> int:
        return min(width, max(0, round((at - origin) / span * width)))

    previous = origin
    for phase, at in _steps(node):
        at = max(at, previous)  # a clock that went back draws nothing
        cells[column(previous):column(at)] = phase_char(phase) * (column(at) - column(previous))
        previous = at
    what = "total" if "end" in node.phases else "so far"
    return (f"node {_label(node):<3} {_short_id(node.instance_id):<{_ID_CHARS}}  "
            f"|{''.join(cells)}|  {what} {previous - origin:.1f}s")


def _table(nodes: list[NodeTimeline], phases: list[str], origin: float) -> list[str]:
    """Per phase, each node's seconds since its previous phase ("-": not reached)."""
    heads = [f"node {_label(n)}" for n in nodes]
    durations = [node_durations(n, origin) for n in nodes]
    first = max([len("seconds since previous"), *map(len, phases)])
    cols = [max(len(h), 8) for h in heads]
    rows = ["seconds since previous".ljust(first) + "".join(
        f"  {h:>{w}}" for h, w in zip(heads, cols))]
    for phase in phases:
        cells = [f"{d[phase]:.2f}" if phase in d else "-" for d in durations]
        rows.append(phase.ljust(first) + "".join(f"  {c:>{w}}" for c, w in zip(cells, cols)))
    return rows
