"""`flow list` once a task's provider can no longer answer for it (its records gone past
their expiry, the simulated account that held it stopped): the status this machine last saw
of the task, marked as such with the reason, rather than `UNKNOWN` (the simulated account's
case runs in tests/sim/test_rehearsal.py). `flow list --json` is one JSON array of rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from flow_testing import wait_until

from flow_sdk import FlowApp, wire
from flow_sdk.cli import main

pytestmark = pytest.mark.slow

app = FlowApp("seen")


def _ranked() -> int:
    import os

    return int(os.environ["RANK"])


def _rows(*args: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(main, ["list", "--json", *args])
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert isinstance(rows, list)
    return rows


def _forget(flow_home: Path, task_id: str) -> None:
    """The local store loses the task's records, as a store past its expiry does."""
    shutil.rmtree(flow_home / "local" / "store" / wire.task_prefix(task_id))


def test_a_task_the_store_forgot_shows_the_status_last_seen(flow_home: Path) -> None:
    waited = app.function(num_instances=2)(_ranked).spawn()
    assert waited.results(timeout=120) == [0, 1]  # waiting sees it end
    listed = app.function()(_ranked).spawn()  # seen ended only by `flow list`
    wait_until(lambda: listed.status.is_terminal, 120, "the second task to end")
    first = {r["task_id"]: r for r in _rows()}
    assert first[listed.task_id]["status"] == "SUCCEEDED"
    assert all(r["last_known"] is None for r in first.values())

    for task in (waited, listed):
        _forget(flow_home, task.task_id)
    rows = {r["task_id"]: r for r in _rows()}
    assert (rows[waited.task_id]["status"], rows[listed.task_id]["status"]) == (
        "SUCCEEDED", "SUCCEEDED")
    assert rows[listed.task_id]["nodes"] == 1  # the row `flow list` saw, whole
    for task in (waited, listed):
        assert "has no record in the local store" in rows[task.task_id]["last_known"]
    text = CliRunner().invoke(main, ["list"]).stdout
    assert f"SUCCEEDED (last seen; task '{waited.task_id}' has no record" in text

    # a task this machine never saw end still says it cannot tell
    never = app.function()(_ranked).spawn()
    wait_until(lambda: never.status.is_terminal, 120, "the third task to end")
    _forget(flow_home, never.task_id)
    row = {r["task_id"]: r for r in _rows()}[never.task_id]
    assert row["last_known"] is None
    assert row["status"].startswith("UNKNOWN (task ") and "has no record" in row["status"]
