"""One task's page: its live state (status, nodes and their phases, cost, the error and its
consequences, stalls with their stacks), its timeline, its logs, cancel and stacks. The
templates ``task.html`` and ``task_state.html`` (the live part, which the task's stream
sends again whenever it changes)."""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from flow_sdk.client.dashboard.render import render
from flow_sdk.client.dashboard.views import ErrorView, LogLayout, TaskState
from flow_sdk.client.stacks import Stacks


def where(error: ErrorView | None) -> str:
    """Where the root cause happened: ``node 1, rank 3, exit code 2``; ``""`` if unknown."""
    if error is None:
        return ""
    return ", ".join(part for part in (
        f"node {error.node}" if error.node is not None else "",
        f"rank {error.rank}" if error.rank is not None else "",
        f"exit code {error.exit_code}" if error.exit_code is not None else "",
        f"signal {error.signal_name}" if error.signal_name else "") if part)


def _state_values(state: TaskState) -> dict[str, Any]:
    return {"row": state.row, "data": state.status, "error": state.error,
            "where": where(state.error), "stalls": state.stalls, "ranks": state.ranks,
            "quiet": state.quiet}


def state_html(state: TaskState) -> Markup:
    """The live part of the page, sent again whenever it changes."""
    return render("task_state.html", **_state_values(state))


def task_page(task_id: str, token: str, state: TaskState, timeline_svg: Markup,
              legend: Markup, layout_: LogLayout, stacks: Stacks | None = None) -> Markup:
    return render("task.html", title=f"Task {task_id}", active="", task_id=task_id,
                  token=token, ended=state.ended, stacks=stacks, timeline=timeline_svg,
                  legend=legend, logs=layout_, **_state_values(state))
