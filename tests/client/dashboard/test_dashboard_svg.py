"""The timeline drawn as SVG on the server: a bar per phase per node, from the previous phase
to it, on one time axis; record text escaped; a task with no node yet gets a note."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from flow_sdk.client.dashboard.svg import legend, phase_colour, render_svg
from flow_sdk.client.timeline import Timeline
from flow_sdk.wire.timeline import NodeTimeline

SVG = "{http://www.w3.org/2000/svg}"


def _timeline() -> Timeline:
    nodes = [NodeTimeline("i-b", 1, {"requested": 100.0, "instance_running": 100.5,
                                     "agent_up": 101.0, "joined": 101.2, "end": 104.0}),
             NodeTimeline("i-a<&>", 0, {"requested": 100.0, "instance_running": 100.4,
                                        "agent_up": 100.9, "joined": 100.8})]  # clock went back
    return Timeline("task-<1>", 100.0, nodes)


def test_one_bar_per_phase_per_node_on_one_axis() -> None:
    root = ET.fromstring(render_svg(_timeline()))
    bars = root.findall(f"{SVG}rect")
    assert [(b.get("data-node"), b.get("data-phase")) for b in bars] == [
        ("0", "instance_running"), ("0", "agent_up"), ("0", "joined"),
        ("1", "instance_running"), ("1", "agent_up"), ("1", "joined"), ("1", "end")]
    assert all(b.get("fill") == phase_colour(b.get("data-phase") or "") for b in bars)
    xs = {(b.get("data-node"), b.get("data-phase")): (float(b.get("x") or 0),
                                                      float(b.get("width") or 0)) for b in bars}
    # node 1's end is the last moment seen: its bar reaches the axis's right end
    x, w = xs[("1", "end")]
    assert abs((x + w) - (xs[("1", "instance_running")][0] + (850 - 90) * 1.0)) < 1.0
    # node 0 joined "before" its agent was up (a clock that went back): drawn at 1 px
    assert xs[("0", "joined")][1] == 1.0
    titles = [b.find(f"{SVG}title").text for b in bars]  # type: ignore[union-attr]
    assert titles[-1] == "node 1 end: 2.80s (at 4.00s)"
    assert 'aria-label="timeline of task task-&lt;1&gt;"' in render_svg(_timeline())


def test_legend_and_an_empty_timeline() -> None:
    assert legend(_timeline()).count('class="legend"') == 4
    assert "no node has reported" in render_svg(Timeline("t", 1.0, []))
