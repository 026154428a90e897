"""A hung task's page in a real headless Chromium does not look healthy: a real 2-node task
whose rank 0 prints once and then waits (``--stall-timeout 3s --on-stall warn``) while rank 1
prints nothing. Its page says "waiting for lines" in a log view that has none, names rank 0
as quiet and stalled with the time since its last line (rank 1: none yet), shows the stall
with its stacks and marks it and "now" on the timeline; once rank 0 raises, "Root cause"
keeps the failure's lines as lines. One task and one browser serve every step."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dashboard_testing import FLOW, SCREENSHOTS, Ui, start_ui

from flow_sdk import Task, TaskStatus

pytestmark = pytest.mark.slow

SCRIPT = """
import os, sys, time
from pathlib import Path
rank = int(os.environ["RANK"])
if rank == 0:
    print("rank 0 step 1", flush=True)
go = Path(sys.argv[1])
while not go.exists():
    time.sleep(0.05)
if rank == 0:
    raise RuntimeError("rank 0 gave up")
time.sleep(300)
"""


@dataclass
class Hung:
    home: Path
    task_id: str
    go: Path
    ui: Ui


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hung]:
    """The task, detached, and a ``flow ui`` over its FLOW_HOME; both stopped after."""
    home = tmp_path_factory.mktemp("hung-home")
    script = home / "hangs.py"
    script.write_text(textwrap.dedent(SCRIPT))
    go = home / "go"
    env = {**os.environ, "FLOW_HOME": str(home)}
    ran = subprocess.run([FLOW, "run", "-d", "-N", "2", "--stall-timeout", "3s",
                          "--on-stall", "warn", str(script), str(go)],
                         capture_output=True, text=True, timeout=120, env=env,
                         stdin=subprocess.DEVNULL, check=True)
    task_id = ran.stdout.strip()
    ui = start_ui(home)
    try:
        yield Hung(home, task_id, go, ui)
    finally:
        ui.stop()
        subprocess.run([FLOW, "cancel", task_id], capture_output=True, timeout=120, env=env,
                       stdin=subprocess.DEVNULL, check=False)


def _log_view(page: object) -> dict[str, object]:
    """The log view's lines and what it shows while it holds none (its ``::before``), read
    at one moment."""
    return page.evaluate(  # type: ignore[attr-defined,no-any-return]
        "() => { const log = document.getElementById('log');"
        " return {lines: [...log.querySelectorAll('div.line')].map((d) => d.textContent),"
        " empty: getComputedStyle(log, '::before').content}; }")


def test_a_hung_task_shows_its_stall_quiet_ranks_and_then_its_root_cause_as_lines(
        hung: Hung, browser: object, monkeypatch: pytest.MonkeyPatch) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 1300})  # type: ignore[attr-defined]
    page.goto(hung.ui.url)
    page.wait_for_selector("#tasks", timeout=30_000)  # signed in: the login's own navigation
    page.goto(f"{hung.ui.base}/tasks/{hung.task_id}")  # to "/" is over

    # rank 1 printed nothing: its log view says so instead of staying black
    page.select_option("#log-rank", "1")
    page.wait_for_function("() => document.querySelector('#log-rank').value === '1'")
    # (on a busy machine rank 0's stall may already be named: a [flow] line every rank shows;
    # the lines and the empty view's text are read in one go, so none arrives in between)
    view = _log_view(page)
    assert all("[flow]" in line for line in view["lines"]), view
    if not view["lines"]:
        assert view["empty"] == '"waiting for lines"', view

    # the stall: named above the nodes, rank 0's row marked with the time since its line
    page.wait_for_selector("#quiet", timeout=60_000)
    assert re.fullmatch(r"no line from rank 0 for \d+s \(stalled\)",
                        page.inner_text("#quiet")), page.inner_text("#quiet")
    row0, row1 = page.locator('#ranks tr[data-rank="0"]'), page.locator('#ranks tr[data-rank="1"]')
    assert row0.get_attribute("class") == "quiet"
    assert re.fullmatch(r"\d+s \(stalled\)", row0.locator("td.since").inner_text())
    assert row1.locator("td").nth(2).inner_text() == "none yet"
    assert row1.get_attribute("class") is None
    first = int(row0.locator("td.since").inner_text().split("s", 1)[0])
    page.wait_for_function(  # the time since its last line keeps counting
        "(first) => parseInt(document.querySelector('#ranks tr[data-rank=\"0\"] td.since')"
        ".textContent) > first", arg=first, timeout=10_000)
    assert "rank 0" in page.inner_text("#stalls")  # the stall with its stacks
    assert page.locator("svg.timeline line.mark.stall").count() == 1
    assert page.locator("svg.timeline line.mark.now").count() == 1
    page.screenshot(path=str(SCREENSHOTS / "hung.png"), full_page=True)

    # rank 0 raises: the root cause keeps its lines
    hung.go.write_text("go")
    page.wait_for_selector('#state-body[data-status="FAILED"]', timeout=60_000)
    monkeypatch.setenv("FLOW_HOME", str(hung.home))
    task = Task.from_id(hung.task_id)
    assert task.status is TaskStatus.FAILED
    outcome = task.outcome()
    assert outcome is not None and outcome.rank == 0
    message = outcome.message.splitlines()
    assert len(message) > 1 and "RuntimeError: rank 0 gave up" in message[0], message
    assert page.inner_text("pre.root-cause").splitlines() == message
    assert page.locator("#ranks").count() == 0 and page.locator("svg.timeline line.mark.now"
                                                                ).count() == 0
    page.wait_for_function("() => document.getElementById('log').dataset.ended === '1'",
                           timeout=30_000)
    # an empty view would now say "no lines" (this one holds the stall's [flow] line)
    assert page.get_attribute("#log", "data-empty") == "no lines"
    page.screenshot(path=str(SCREENSHOTS / "root-cause.png"), full_page=True)
    page.close()
