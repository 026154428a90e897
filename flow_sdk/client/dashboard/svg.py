"""A task's timeline (``flow_sdk.client.timeline.Timeline``) drawn as SVG on the server: one
row per node, one bar per phase from the previous phase to it, on a shared time axis from
the request; each bar's title says the phase and its seconds. While the task runs the axis
reaches now (a line marks it), so a task whose last phase was long ago shows the gap; each
stall the leader recorded is a line of its own. ``drawing`` computes where each thing goes
(pure); the template ``timeline.svg`` writes it, escaping every value."""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup

from flow_sdk.client.dashboard.render import render
from flow_sdk.client.dashboard.render import seconds
from flow_sdk.client.timeline import Timeline
from flow_sdk.wire.stacks import StallRecord
from flow_sdk.wire.timeline import NodeTimeline

WIDTH = 880
LABEL_W = 90
ROW_H = 26
BAR_H = 16
AXIS_H = 24
TICKS = 5
PHASE_COLOURS: dict[str, str] = {
    "instance_running": "#9aa5b1",
    "boot_started": "#b8a1d9",
    "code_installed": "#8fb3e0",
    "agent_up": "#6fa8dc",
    "joined": "#76c7b0",
    "barrier_released": "#f6c26b",
    "first_worker_line": "#e69a8d",
    "end": "#7fbf7f",
}
GENERATION_COLOUR = "#c9a0dc"


def phase_colour(phase: str) -> str:
    return PHASE_COLOURS.get(phase, GENERATION_COLOUR)


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class NodeLabel:
    y: int
    text: str


@dataclass(frozen=True)
class Bar:
    node: str
    phase: str
    x: float
    y: int
    width: float
    colour: str
    title: str


@dataclass(frozen=True)
class Mark:
    """A moment across every row: ``now`` or a stall."""

    kind: str  # "now" or "stall"
    x: float
    label: str
    title: str


@dataclass(frozen=True)
class Drawing:
    task_id: str
    width: int
    height: int
    grid_top: int
    tick_y: int
    bar_h: int
    ticks: list[Tick]
    labels: list[NodeLabel]
    bars: list[Bar]
    marks: list[Mark]


def _segments(node: NodeTimeline, origin: float) -> list[tuple[str, float, float]]:
    """(phase, start, end) in seconds from ``origin``: each phase's bar runs from the node's
    previous phase (``requested`` first) to it; a clock that went back draws nothing."""
    found = []
    previous = origin
    for phase, at in node.ordered():
        if phase == "requested":
            continue
        at = max(at, previous)
        found.append((phase, previous - origin, at - origin))
        previous = at
    return found


def _node_label(node: NodeTimeline) -> str:
    return "node ?" if node.node is None else f"node {node.node}"


def drawing(timeline: Timeline, now: float | None = None,
            stalls: tuple[StallRecord, ...] = ()) -> Drawing | None:
    """Where every tick, label, bar and mark of the timeline goes; ``None`` with no node
    yet. ``now``: while the task runs, the axis reaches it; ``stalls``: each one marked."""
    nodes = sorted(timeline.nodes, key=lambda n: (n.node is None, n.node or 0, n.instance_id))
    if not nodes:
        return None
    rows = [(n, _segments(n, timeline.requested_at)) for n in nodes]
    origin = timeline.requested_at
    moments = [at - origin for at in [*(s.at for s in stalls), *([now] if now else [])]]
    span = max([end for _, segs in rows for _, _, end in segs] + moments, default=0.0) or 1.0
    plot_w = WIDTH - LABEL_W - 30  # room for the last tick's label
    height = AXIS_H + ROW_H * len(rows)
    ticks = [Tick(round(LABEL_W + plot_w * i / TICKS, 1),
                  seconds(span * i / TICKS) if span >= 60 else
                  f"{span * i / TICKS:.{2 if span < 2 else 1}f}s") for i in range(TICKS + 1)]
    labels, bars = [], []
    for index, (node, segments) in enumerate(rows):
        y = AXIS_H + index * ROW_H
        labels.append(NodeLabel(y + BAR_H - 2, _node_label(node)))
        for phase, start, end in segments:
            bars.append(Bar(
                str(node.node), phase, round(LABEL_W + plot_w * start / span, 1), y,
                round(max(plot_w * (end - start) / span, 1.0), 1), phase_colour(phase),
                f"{_node_label(node)} {phase}: {end - start:.2f}s (at {end:.2f}s)"))
    def x_of(at: float) -> float:
        return round(LABEL_W + plot_w * max(0.0, at - origin) / span, 1)

    last = max((end for _, segs in rows for _, _, end in segs), default=0.0)
    marks = [Mark("stall", x_of(s.at), "stall", f"{seconds(s.at - origin)}: {s.summary()}")
             for s in stalls]
    if now:
        marks.append(Mark("now", x_of(now), "now", (
            f"now, {seconds(now - origin)} after the request; the last phase was "
            f"{seconds(now - origin - last)} before")))
    return Drawing(timeline.task_id, WIDTH, height, AXIS_H - 6, AXIS_H - 10, BAR_H, ticks,
                   labels, bars, marks)


def render_svg(timeline: Timeline, now: float | None = None,
               stalls: tuple[StallRecord, ...] = ()) -> Markup:
    """The timeline as an ``<svg>`` element; a task with no node yet gets a one-line note."""
    found = drawing(timeline, now, stalls)
    if found is None:
        return render("note.html", text="no node has reported a phase yet", cls="muted")
    return render("timeline.svg", d=found)


def legend(timeline: Timeline) -> Markup:
    """The phases drawn, each with its colour, as HTML."""
    seen = dict.fromkeys(p for n in timeline.nodes for p, _ in n.ordered() if p != "requested")
    return render("legend.html", swatches=[(p, phase_colour(p)) for p in seen])
