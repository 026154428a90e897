"""Escaping is structural: every page, stream fragment and the timeline is a Jinja2 template
with autoescape on; markup in any record field comes out as text; no template holds script,
an event handler or a style attribute (the Content-Security-Policy allows none); no HTML is
written in the package's Python."""

from __future__ import annotations

import ast
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

from flow_sdk.client.dashboard import pages, render, svg, taskpage
from flow_sdk.client.dashboard.views import ErrorView, LogLayout, StallView, TaskState
from flow_sdk.client.overview import PoolRow, TaskRow
from flow_sdk.client.stacks import Stacks
from flow_sdk.client.timeline import Timeline
from flow_sdk.providers.base import VolumeInfo
from flow_sdk.wire.stacks import StackDump, StallRecord
from flow_sdk.wire.timeline import NodeTimeline

PACKAGE = Path(render.__file__).resolve().parent
H = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'&"


class _Elements(HTMLParser):
    """Every start tag with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))


def _only_our_markup(html: str) -> None:
    assert H not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html, html
    parser = _Elements()
    parser.feed(html)
    for tag, attrs in parser.found:
        assert tag != "img", (tag, attrs)
        assert tag != "script" or attrs == {"defer": None, "src": "/static/dashboard.js"}
        assert not [a for a in attrs if a.startswith("on") or a == "style"], (tag, attrs)


def _row() -> TaskRow:
    return TaskRow(H, H, H, H, f"FAILED {H}", 2, 1.0, 5.0, 0.1, 1.0, H, waiting=H)


def _state() -> TaskState:
    node = {"node": 0, "instance_id": H, "address": H, "phase": H, "workers": 1, "state": H,
            "ssh": H}
    error = ErrorView(H, H, H, 0, 1, 2, H, [H], [H], H, H)
    stall = StallRecord(1, [0], [0], 5.0, 5.0, 1, "warn", H, 1.0)
    return TaskState(_row(), {"nodes": [node], "num_instances": 1, "stalls": [H],
                                "waiting": H}, error,
                     [StallView(stall, [StackDump(0, 0, H, 1.0, H)])])


def test_markup_in_every_record_field_is_text_on_every_page() -> None:
    timeline = Timeline(H, 1.0, [NodeTimeline(H, 0, {"requested": 1.0, "agent_up": 2.0})])
    stacks = Stacks(H, [StackDump(0, 0, H, 1.0, H)], [1])
    for html in (
            pages.tasks_page([_row()], [H], H, H),
            pages.pools_page([PoolRow(H, H, H, 1, {H: 1}, 1.0, 1.0, None)]),
            pages.volumes_page(H, [H], [VolumeInfo(H, H, 1, H, H, in_use_by=(H,))], None),
            pages.volumes_page(H, [H], None, H),
            pages.message_page(H, H),
            pages.note(H),
            pages.landing_page(f"/?x={H}"),
            taskpage.state_html(_state()),
            taskpage.task_page(H, H, _state(), svg.render_svg(timeline), svg.legend(timeline),
                               LogLayout(1, 1), stacks)):
        _only_our_markup(str(html))


def test_the_timeline_escapes_and_parses_as_xml() -> None:
    timeline = Timeline(H, 1.0, [NodeTimeline(H, 0, {"requested": 1.0, "agent_up": 2.0})])
    drawn = str(svg.render_svg(timeline))
    root = ET.fromstring(drawn)
    assert root.get("aria-label") == f"timeline of task {H}"
    assert "<script" not in drawn and "<img" not in drawn


def test_templates_write_no_script_handler_or_style_and_never_turn_escaping_off() -> None:
    templates = sorted((PACKAGE / "templates").iterdir())
    assert len(templates) >= 10
    for path in templates:
        text = path.read_text()
        assert "|safe" not in text.replace(" ", "") and "autoescape" not in text, path
        assert "Markup" not in text, path
        assert not re.search(r"<script(?![^>]*\ssrc=)", text), path
        assert not re.search(r"\son[a-z]+\s*=", text), path
        assert not re.search(r"\sstyle\s*=", text) and "javascript:" not in text, path


def test_no_html_is_written_in_the_packages_python() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                                    | ast.AsyncFunctionDef)
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docstrings:
                assert not re.search(r"<[a-zA-Z!/]", node.value), (path.name, node.value)
        # markup comes from templates only: ``render`` is the one maker of ``Markup``
        made = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Name) and n.func.id == "Markup" and n.args]
        assert made == [] or path.name == "render.py", (path.name, made)
