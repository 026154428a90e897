"""The timeline drawn as SVG on the server: a bar per phase per node, from the previous phase
to it, on one time axis; while the task runs the axis reaches now and each stall is marked;
record text escaped; a task with no node yet gets a note."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from flow_sdk.client.dashboard.svg import legend, phase_colour, render_svg
from flow_sdk.client.timeline import Timeline
from flow_sdk.wire.stacks import StallRecord
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


def test_while_it_runs_the_axis_reaches_now_and_each_stall_is_marked() -> None:
    stall = StallRecord(1, [1], [1], 31.0, 30.0, 1, "warn", "stall: rank 1 <idle>", 150.0)
    root = ET.fromstring(render_svg(_timeline(), now=322.0, stalls=(stall,)))
    ticks = [t.text for t in root.findall(f"{SVG}text[@class='tick']")]
    assert ticks[-1] == "3m 42s", ticks  # the axis runs to now, not to the last phase (4 s)
    marks = {m.get("class"): m for m in root.findall(f"{SVG}line")
             if (m.get("class") or "").startswith("mark")}
    assert set(marks) == {"mark now", "mark stall"}
    assert float(marks["mark now"].get("x1") or 0) == 850.0
    assert abs(float(marks["mark stall"].get("x1") or 0) - (90 + 760 * 50 / 222)) < 0.1
    titles = {k: m.find(f"{SVG}title").text for k, m in marks.items()}  # type: ignore[union-attr]
    assert titles["mark now"] == ("now, 3m 42s after the request; the last phase was 3m 38s "
                                  "before")
    assert titles["mark stall"] == "50s: stall: rank 1 <idle> (warn)"  # escaped in the markup
    # an ended task: no marks of now
    assert "mark now" not in render_svg(_timeline(), stalls=(stall,))
