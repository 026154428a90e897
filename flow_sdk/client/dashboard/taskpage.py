"""One task's page: its live state (status, nodes and their phases, cost, the error and its
consequences, stalls with their stacks), its timeline, its logs, cancel and stacks."""

from __future__ import annotations

from html import escape
from typing import Any

from flow_sdk.client.dashboard.pages import layout, seconds, status_badge, usd, when
from flow_sdk.client.dashboard.views import ErrorView, LogLayout, StallView, TaskState
from flow_sdk.client.stacks import Stacks
from flow_sdk.wire.stacks import StackDump


def _pre(lines: list[str] | str, cls: str = "") -> str:
    text = lines if isinstance(lines, str) else "\n".join(lines)
    return f'<pre class="{cls}">{escape(text)}</pre>'


def nodes_html(nodes: list[dict[str, Any]], expected: int | None) -> str:
    rows = "".join(
        f'<tr data-node="{n["node"]}"><td>{n["node"]}</td><td>{escape(n["instance_id"])}</td>'
        f'<td>{escape(n["address"])}</td><td class="phase">{escape(str(n["phase"]))}</td>'
        f'<td class="num">{n["workers"]}</td><td>{escape(n["state"])}</td>'
        f'<td><code>{escape(n["ssh"] or "-")}</code></td></tr>' for n in nodes)
    waiting = "" if nodes else (f'<tr><td colspan=7 class="muted">waiting for '
                                f"{expected or '?'} node(s) to join</td></tr>")
    return ('<table id="nodes"><thead><tr><th>Node</th><th>Instance</th><th>Address</th>'
            "<th>Phase</th><th>Workers</th><th>State</th><th>SSH</th></tr></thead>"
            f"<tbody>{rows}{waiting}</tbody></table>")


def error_html(error: ErrorView) -> str:
    where = ", ".join(part for part in (
        f"node {error.node}" if error.node is not None else "",
        f"rank {error.rank}" if error.rank is not None else "",
        f"exit code {error.exit_code}" if error.exit_code is not None else "",
        f"signal {error.signal_name}" if error.signal_name else "") if part)
    label = (f' <span class="label">{escape(error.label)} failure</span>'
             if error.label else "")
    parts = [f'<section id="error"><h2>{escape(error.status)}{label}</h2>',
             f'<p class="root-cause"><b>Root cause</b>: {escape(error.message)}'
             + (f" ({escape(where)})" if where else "") + "</p>"]
    if error.exception:
        parts.append(f"<p><b>Raises</b> <code>{escape(error.exception)}</code></p>")
    if error.traceback:
        parts.append("<details open><summary>Traceback</summary>"
                     f"{_pre(error.traceback)}</details>")
    if error.consequences:
        items = "".join(f"<li>{escape(c)}</li>" for c in error.consequences)
        parts.append(f'<h3>Then, as consequences ({len(error.consequences)})</h3>'
                     f'<ol class="consequences">{items}</ol>')
    if error.log_tail:
        parts.append(f"<details><summary>Its last log lines</summary>{_pre(error.log_tail)}"
                     "</details>")
    return "".join(parts) + "</section>"


def dumps_html(dumps: list[StackDump], odd: list[int]) -> str:
    return "".join(
        f'<details{" open" if d.rank in odd else ""}><summary>rank {d.rank} (node {d.node})'
        f'{" — stands apart" if d.rank in odd else ""}</summary>{_pre(d.text, "stack")}'
        "</details>" for d in dumps)


def stalls_html(stalls: list[StallView]) -> str:
    if not stalls:
        return ""
    parts = ['<section id="stalls"><h2>Stalls</h2>']
    for view in stalls:
        stall = view.stall
        parts.append(f"<p><b>{when(stall.at)}</b>: {escape(stall.summary())}</p>")
        parts.append(dumps_html(view.dumps, stall.odd_ranks))
    return "".join(parts) + "</section>"


def state_html(state: TaskState) -> str:
    """The live part of the page, sent again whenever it changes."""
    row, data = state.row, state.status
    facts = [("Status", status_badge(row.status)), ("App / name",
             escape(f"{row.app or '-'} / {row.name or '-'}")),
             ("Provider", escape(row.provider or "-")), ("Created", when(row.created_at)),
             ("Elapsed", seconds(row.elapsed_s)), ("Cost so far", usd(row.cost_so_far, 4)),
             ("$/h", usd(row.cost_per_hour)),
             ("Nodes", f"{len(data['nodes'])} of {data['num_instances']} joined")]
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    stalled = "".join(f'<p class="warn">stalled: {escape(s)}</p>' for s in data["stalls"])
    return (f'<div id="state-body" data-status="{escape(row.status)}">'
            f'<dl class="facts">{dl}</dl>{stalled}'
            f"{nodes_html(data['nodes'], data['num_instances'])}"
            f"{error_html(state.error) if state.error else ''}"
            f"{stalls_html(state.stalls)}</div>")


def _options(name: str, count: int, label: str) -> str:
    choices = "".join(f'<option value="{i}">{label} {i}</option>' for i in range(count))
    return (f'<select id="log-{name}" name="{name}"><option value="">every {label}</option>'
            f"{choices}</select>")


def logs_html(task_id: str, layout_: LogLayout) -> str:
    return ('<section id="logs"><h2>Logs</h2><div class="log-tools">'
            f'{_options("node", layout_.nodes, "node")}{_options("rank", layout_.ranks, "rank")}'
            '<input id="log-search" type="search" placeholder="search the lines" '
            'autocomplete="off"><span id="log-count" class="muted"></span></div>'
            f'<div id="log" data-logs="/events/logs/{escape(task_id)}"></div></section>')


def actions_html(task_id: str, token: str, ended: bool, stacks: Stacks | None) -> str:
    hidden = f'<input type="hidden" name="token" value="{escape(token)}">'
    parts = []
    if not ended:
        parts.append(
            '<details id="cancel"><summary>Cancel task…</summary>'
            f'<form method="post" action="/tasks/{escape(task_id)}/cancel">{hidden}'
            "<p>Stop every worker on every node and tear the nodes down? This cannot be "
            'undone.</p><button id="confirm-cancel" type="submit" class="danger">Yes, cancel '
            "the task</button></form></details>"
            f'<form id="stacks-form" method="post" action="/tasks/{escape(task_id)}/stacks">'
            f'{hidden}<button type="submit">Take every worker\'s stacks now</button></form>')
    if stacks is not None:
        missing = (f'<p class="warn">no answer from rank(s) '
                   f'{", ".join(map(str, stacks.missing))}</p>' if stacks.missing else "")
        parts.append(f'<section id="stacks"><h2>Stacks, taken now</h2>{missing}'
                     f"{dumps_html(stacks.dumps, stacks.odd_ranks)}</section>")
    return f'<div id="actions">{"".join(parts)}</div>'


def task_page(task_id: str, token: str, state: TaskState, timeline_svg: str,
              legend: str, layout_: LogLayout, stacks: Stacks | None = None) -> str:
    body = (f'<h1>Task <code id="task-id">{escape(task_id)}</code></h1>'
            f'<section id="state" data-sse="/events/task/{escape(task_id)}">'
            f"{state_html(state)}</section>"
            f"{actions_html(task_id, token, state.ended, stacks)}"
            f'<section><h2>Timeline</h2><div id="timeline">{timeline_svg}</div>'
            f'<div id="legend">{legend}</div></section>'
            f"{logs_html(task_id, layout_)}")
    return layout(f"Task {task_id}", body, "")
