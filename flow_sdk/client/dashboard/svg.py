"""A task's timeline (``flow_sdk.client.timeline.Timeline``) drawn as SVG on the server: one
row per node, one bar per phase from the previous phase to it, on a shared time axis from
the request; each bar's title says the phase and its seconds. Pure: no I/O."""

from __future__ import annotations

from html import escape

from flow_sdk.client.timeline import Timeline
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


def render_svg(timeline: Timeline) -> str:
    """The timeline as an ``<svg>`` element; a task with no node yet gets a one-line note."""
    nodes = sorted(timeline.nodes, key=lambda n: (n.node is None, n.node or 0, n.instance_id))
    if not nodes:
        return '<p class="muted">no node has reported a phase yet</p>'
    rows = [(n, _segments(n, timeline.requested_at)) for n in nodes]
    span = max((end for _, segs in rows for _, _, end in segs), default=0.0) or 1.0
    plot_w = WIDTH - LABEL_W - 30  # room for the last tick's label
    height = AXIS_H + ROW_H * len(rows)
    parts = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
             f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
             f'aria-label="timeline of task {escape(timeline.task_id)}">']
    for i in range(TICKS + 1):
        x = LABEL_W + plot_w * i / TICKS
        parts.append(f'<line x1="{x:.1f}" y1="{AXIS_H - 6}" x2="{x:.1f}" y2="{height}" '
                     'class="grid"/>')
        parts.append(f'<text x="{x:.1f}" y="{AXIS_H - 10}" class="tick">'
                     f'{span * i / TICKS:.{2 if span < 2 else 1}f}s</text>')
    for index, (node, segments) in enumerate(rows):
        y = AXIS_H + index * ROW_H
        parts.append(f'<text x="4" y="{y + BAR_H - 2}" class="node-label">'
                     f'{escape(_node_label(node))}</text>')
        for phase, start, end in segments:
            x = LABEL_W + plot_w * start / span
            w = max(plot_w * (end - start) / span, 1.0)
            parts.append(
                f'<rect class="bar" data-node="{escape(str(node.node))}" '
                f'data-phase="{escape(phase)}" x="{x:.1f}" y="{y}" width="{w:.1f}" '
                f'height="{BAR_H}" fill="{phase_colour(phase)}"><title>'
                f'{escape(_node_label(node))} {escape(phase)}: {end - start:.2f}s '
                f'(at {end:.2f}s)</title></rect>')
    parts.append("</svg>")
    return "".join(parts)


def legend(timeline: Timeline) -> str:
    """The phases drawn, each with its colour, as HTML."""
    seen = dict.fromkeys(p for n in timeline.nodes for p, _ in n.ordered() if p != "requested")
    return "".join(f'<span class="legend"><i style="background:{phase_colour(p)}"></i>'
                   f"{escape(p)}</span>" for p in seen)
