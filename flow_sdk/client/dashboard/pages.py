"""The dashboard's pages other than a task's: the tasks list (and its rows, which the task
list's stream sends again), the pools, the volumes and a message. Each is a template of
``templates/`` rendered by ``render``; the only script is the package's own
``dashboard.js``."""

from __future__ import annotations

from urllib.parse import urlencode

from markupsafe import Markup

from flow_sdk.client.dashboard.render import render
from flow_sdk.client.overview import PoolRow, TaskRow
from flow_sdk.providers.base import VolumeInfo

STATUSES = ("PENDING", "PROVISIONING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED",
            "TIMED_OUT")


def task_rows_html(rows: list[TaskRow]) -> Markup:
    return render("task_rows.html", rows=rows)


def tasks_page(rows: list[TaskRow], apps: list[str], app: str | None,
               status: str | None) -> Markup:
    query = urlencode({k: v for k, v in (("app", app), ("status", status)) if v})
    return render("tasks.html", title="Tasks", active="/", rows=rows, apps=apps, app=app,
                  status=status, statuses=STATUSES,
                  stream="/events/tasks" + (f"?{query}" if query else ""))


def pools_page(rows: list[PoolRow]) -> Markup:
    return render("pools.html", title="Pools", active="/pools", rows=rows)


def volumes_page(provider: str, providers: list[str], found: list[VolumeInfo] | None,
                 error: str | None) -> Markup:
    return render("volumes.html", title="Volumes", active="/volumes", provider=provider,
                  providers=providers, found=found or [], error=error)


def message_page(title: str, text: str) -> Markup:
    return render("message.html", title=title, active="", text=text)


def landing_page(location: str) -> Markup:
    """The first visit's page: moves the browser on to ``location`` (no token in it)."""
    return render("landing.html", location=location)


def note(text: str, cls: str = "error") -> Markup:
    """One paragraph: what a part of a page shows when it cannot be read."""
    return render("note.html", text=text, cls=cls)
