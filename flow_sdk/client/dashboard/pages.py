"""The dashboard's HTML: the shared layout, the tasks list, the pools and the volumes. Every
value from a record is escaped; the only script is the package's own ``dashboard.js``."""

from __future__ import annotations

import time
from html import escape
from urllib.parse import urlencode

from flow_sdk.client.overview import PoolRow, TaskRow
from flow_sdk.providers.base import VolumeInfo

STATUSES = ("PENDING", "PROVISIONING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED",
            "TIMED_OUT")
NAV = (("/", "Tasks"), ("/pools", "Pools"), ("/volumes", "Volumes"))


def layout(title: str, body: str, active: str) -> str:
    nav = "".join(f'<a href="{href}"{" class=active" if href == active else ""}>{name}</a>'
                  for href, name in NAV)
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<title>{escape(title)} · flow</title>"
            '<meta name=viewport content="width=device-width, initial-scale=1">'
            '<link rel=icon href="data:,"><link rel=stylesheet href="/static/dashboard.css">'
            '<script defer src="/static/dashboard.js"></script></head>'
            f'<body><header><b>flow</b><nav>{nav}</nav></header><main>{body}</main>'
            "</body></html>")


def seconds(value: float | None) -> str:
    """``75`` -> ``1m 15s``; ``None`` -> ``-``."""
    if value is None:
        return "-"
    value = int(value)
    if value >= 3600:
        return f"{value // 3600}h {value % 3600 // 60}m"
    if value >= 60:
        return f"{value // 60}m {value % 60}s"
    return f"{value}s"


def usd(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"${value:,.{digits}f}"


def when(epoch: float | None) -> str:
    return "-" if epoch is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def status_badge(status: str) -> str:
    word = status.split(" ", 1)[0]
    return f'<span class="status s-{escape(word.lower())}">{escape(status)}</span>'


def task_row_html(row: TaskRow) -> str:
    label = escape(row.label) if row.label else ""
    return (f'<tr data-task="{escape(row.task_id)}" data-status="{escape(row.status)}">'
            f'<td><a href="/tasks/{escape(row.task_id)}">{escape(row.task_id)}</a></td>'
            f"<td>{escape(row.app or '-')}</td><td>{escape(row.name or '-')}</td>"
            f"<td>{status_badge(row.status)}</td>"
            f'<td class="num">{"-" if row.nodes is None else row.nodes}</td>'
            f"<td>{escape(row.provider or '-')}</td>"
            f'<td class="num">{seconds(row.elapsed_s)}</td>'
            f'<td class="num">{usd(row.cost_so_far, 4)}</td>'
            f'<td class="num">{usd(row.cost_per_hour)}</td>'
            f'<td class="label">{label}</td></tr>')


def task_rows_html(rows: list[TaskRow]) -> str:
    if not rows:
        return ('<tr><td colspan=10 class="muted">no tasks match; start one with '
                "<code>flow run FILE.py</code></td></tr>")
    return "".join(task_row_html(r) for r in rows)


def _select(name: str, choices: list[str], chosen: str | None) -> str:
    options = ['<option value="">all</option>'] + [
        f'<option value="{escape(c)}"{" selected" if c == chosen else ""}>{escape(c)}</option>'
        for c in choices]
    return f'<select name="{name}" id="filter-{name}">{"".join(options)}</select>'


def tasks_page(rows: list[TaskRow], apps: list[str], app: str | None,
               status: str | None) -> str:
    query = urlencode({k: v for k, v in (("app", app), ("status", status)) if v})
    stream = "/events/tasks" + (f"?{query}" if query else "")
    body = (
        "<h1>Tasks</h1>"
        '<form class="filters" method="get" action="/">'
        f"<label>App {_select('app', apps, app)}</label>"
        f"<label>Status {_select('status', list(STATUSES), status)}</label>"
        "<button type=submit>Filter</button></form>"
        f'<table id="tasks" data-sse="{escape(stream)}"><thead><tr><th>Task</th><th>App</th>'
        "<th>Name</th><th>Status</th><th>Nodes</th><th>Provider</th><th>Elapsed</th>"
        "<th>Cost so far</th><th>$/h</th><th>Failure</th></tr></thead>"
        f'<tbody id="task-rows">{task_rows_html(rows)}</tbody></table>')
    return layout("Tasks", body, "/")


def pools_page(rows: list[PoolRow]) -> str:
    now_rows = "".join(
        f'<tr data-pool="{escape(r.name)}"><td>{escape(r.name)}</td>'
        f"<td>{escape(r.provider)}</td><td>{status_badge(r.state)}</td>"
        f'<td class="num">{r.live_nodes}</td><td>'
        f"{escape(', '.join(f'{n} {s}' for s, n in r.node_states.items()) or 'none')}</td>"
        f'<td class="num">{seconds(r.idle_s)}</td>'
        f'<td class="num">{"-" if r.stop_in_s is None else "in " + seconds(r.stop_in_s)}</td>'
        f'<td class="num">{usd(r.usd_per_hour, 4)}</td></tr>' for r in rows)
    if not rows:
        now_rows = ('<tr><td colspan=8 class="muted">no pools; make one with '
                    "<code>flow pool up NAME -N 2</code></td></tr>")
    body = ("<h1>Pools</h1><table id=pools><thead><tr><th>Pool</th><th>Provider</th>"
            "<th>State</th><th>Nodes</th><th>Node states</th><th>Idle</th>"
            f"<th>Auto-stop</th><th>$/h</th></tr></thead><tbody>{now_rows}</tbody></table>")
    return layout("Pools", body, "/pools")


def volumes_page(provider: str, providers: list[str], found: list[VolumeInfo] | None,
                 error: str | None) -> str:
    tabs = " ".join(
        f'<a href="/volumes?{urlencode({"provider": p})}"'
        f'{" class=active" if p == provider else ""}>{escape(p)}</a>' for p in providers)
    if error is not None:
        table = f'<p class="error">{escape(error)}</p>'
    else:
        rows = "".join(
            f'<tr data-volume="{escape(v.name)}"><td>{escape(v.name)}</td>'
            f"<td>{escape(v.interface)}</td>"
            f'<td class="num">{"-" if v.size_gb is None else v.size_gb}</td>'
            f"<td>{escape(', '.join(v.in_use_by) or '-')}</td>"
            f"<td><code>{escape(v.location)}</code></td></tr>" for v in found or [])
        rows = rows or ('<tr><td colspan=5 class="muted">no volumes; make one with '
                        "<code>flow volumes create NAME</code></td></tr>")
        table = ("<table id=volumes><thead><tr><th>Volume</th><th>Interface</th><th>GB</th>"
                 f"<th>In use by</th><th>Location</th></tr></thead><tbody>{rows}</tbody></table>")
    body = f'<h1>Volumes</h1><p class="tabs">Provider: {tabs}</p>{table}'
    return layout("Volumes", body, "/volumes")


def message_page(title: str, text: str) -> str:
    return layout(title, f'<h1>{escape(title)}</h1><p class="error">{escape(text)}</p>', "")
