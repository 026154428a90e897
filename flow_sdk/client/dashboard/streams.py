"""The dashboard's server-sent events. Each stream is an async generator of events for
``sse_starlette``: ``html`` (``{"id": ELEMENT, "html": ...}``: replace that element's
content with markup the templates rendered on the server), ``lines`` (log lines as data,
which the page writes as text: ``[[node, rank, kind, line], ...]``) and ``end`` (the task
ended: nothing more will come, the page closes the stream)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from anyio import to_thread
from markupsafe import Markup

from flow_sdk.client.dashboard.lastlines import LastLines
from flow_sdk.client.dashboard.pages import note, task_rows_html
from flow_sdk.client.dashboard.svg import legend, render_svg
from flow_sdk.client.dashboard.taskpage import state_html
from flow_sdk.client.dashboard.views import (
    TaskRows,
    TaskState,
    describe,
    task_state,
    task_timeline,
)
from flow_sdk.client.task import Task
from flow_sdk.errors import FlowError

Event = dict[str, str]
TASKS_POLL_S = 1.0
TASK_POLL_S = 0.5


def html_event(element: str, html: Markup) -> Event:
    return {"event": "html", "data": json.dumps({"id": element, "html": html})}


END: Event = {"event": "end", "data": "{}"}


async def tasks_events(app: str | None, status: str | None) -> AsyncIterator[Event]:
    """The task list's rows whenever they change (each second at most)."""
    rows = TaskRows()
    last = None
    while True:
        html = task_rows_html(await to_thread.run_sync(rows.rows, app, status))
        if html != last:
            last = html
            yield html_event("task-rows", html)
        await asyncio.sleep(TASKS_POLL_S)


def timeline_html(task: Task, state: TaskState | None) -> tuple[Markup, Markup]:
    """(the timeline's SVG, its legend), or a note saying why it cannot be read. While the
    task runs its axis reaches now; the stalls of ``state`` are marked."""
    try:
        timeline = task_timeline(task)
    except FlowError as exc:
        return note(f"timeline: {describe(exc)}"), Markup()
    running = state is not None and not state.ended
    stalls = tuple(view.stall for view in state.stalls) if state is not None else ()
    return render_svg(timeline, time.time() if running else None, stalls), legend(timeline)


def _state(task: Task, lines: LastLines) -> tuple[Markup, TaskState | None]:
    try:
        state = task_state(task, lines)
    except FlowError as exc:
        return note(describe(exc)), None
    return state_html(state), state


async def task_events(task: Task) -> AsyncIterator[Event]:
    """The task's live state and timeline whenever they change, until it has ended."""
    sent: dict[str, Markup] = {}
    lines = LastLines(task)
    while True:
        html, state = await to_thread.run_sync(_state, task, lines)
        svg, key = await to_thread.run_sync(timeline_html, task, state)
        for element, markup in (("state", html), ("timeline", svg), ("legend", key)):
            if sent.get(element) != markup:
                sent[element] = markup
                yield html_event(element, markup)
        if state is not None and state.ended:
            yield END
            return
        await asyncio.sleep(TASK_POLL_S)


class LogFollower:
    """Reads ``task.log_entries(..., follow=True)`` in a thread of its own (a blocking
    iterator) and hands its lines to the event loop in batches. ``stop`` makes the thread
    return at its next line; the iterator ends by itself when the task ends."""

    def __init__(self, entries: Iterator[dict[str, Any]]) -> None:
        self._entries = entries
        self._lock = threading.Lock()
        self._batch: list[list[Any]] = []
        self._finished = False
        self._error: str | None = None
        self._stop = threading.Event()
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="flow-ui-logs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _signal(self) -> None:
        self._loop.call_soon_threadsafe(self._wake.set)

    def _run(self) -> None:
        try:
            for entry in self._entries:
                with self._lock:
                    first = not self._batch
                    self._batch.append([entry["node"], entry["rank"], entry["kind"],
                                        entry["line"]])
                if first:
                    self._signal()
                if self._stop.is_set():
                    return
        except FlowError as exc:
            self._error = describe(exc)
        finally:
            self._finished = True
            if not self._loop.is_closed():
                self._signal()

    async def batches(self) -> AsyncIterator[Event]:
        while True:
            await self._wake.wait()
            self._wake.clear()
            with self._lock:
                batch, self._batch = self._batch, []
            if batch:
                yield {"event": "lines", "data": json.dumps(batch)}
            if self._finished and not self._batch:
                if self._error is not None:
                    yield {"event": "lines", "data": json.dumps(
                        [[None, None, "error", f"flow ui: logs: {self._error}"]])}
                yield END
                return


async def log_events(entries: Iterator[dict[str, Any]]) -> AsyncIterator[Event]:
    """The lines of a followed ``log_entries`` as they come, batched; ``end`` after the
    last one once the task ended."""
    follower = LogFollower(entries)
    follower.start()
    try:
        async for event in follower.batches():
            yield event
    finally:
        follower.stop()
