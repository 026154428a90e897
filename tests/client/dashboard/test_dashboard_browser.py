"""The dashboard in a real headless Chromium while a real 2-node task runs on the local
provider: the task list shows it live, its page shows both nodes reach ``running``, draws
its timeline, shows a line rank 1 prints within 2 s of the print, filters and searches the
logs, and cancels the task after a confirmation. One task and one browser serve every step
(they run in order in one test); screenshots go to ``screenshots/``."""

from __future__ import annotations

import os
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dashboard_testing import FLOW, SCREENSHOTS, Ui, alive, start_ui
from flow_testing import processes_with_env, wait_until

from flow_sdk import Task, TaskStatus

pytestmark = pytest.mark.slow

# Every rank says it is ready; rank 1 prints a stamped marker once the go file appears.
SCRIPT = """
import os, sys, time
from pathlib import Path
rank = int(os.environ["RANK"])
print(f"rank {rank} ready", flush=True)
go = Path(sys.argv[1])
while rank == 1 and not go.exists():
    time.sleep(0.01)
if rank == 1:
    print(f"marker from rank 1 at {time.time():.3f}", flush=True)
time.sleep(300)
"""
# Records, in the page, when each log line that holds the marker arrives (the page's clock
# is this machine's: the print's stamp and the arrival compare directly).
ARRIVALS = """
window.__arrivals = [];
new MutationObserver((changes) => {
  const now = Date.now() / 1000;
  for (const change of changes) for (const node of change.addedNodes) {
    if (node.classList && node.classList.contains("line") && node.textContent.includes("marker"))
      window.__arrivals.push([now, node.textContent]);
  }
}).observe(document, {childList: true, subtree: true});
"""


@dataclass
class World:
    home: Path
    task_id: str
    go: Path
    ui: Ui


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """A 2-node task held running and a ``flow ui`` over its FLOW_HOME; both stopped after."""
    home = tmp_path_factory.mktemp("dashboard-home")
    script = home / "hold.py"
    script.write_text(textwrap.dedent(SCRIPT))
    go = home / "go"
    env = {**os.environ, "FLOW_HOME": str(home)}
    ran = subprocess.run([FLOW, "run", "-d", "-N", "2", str(script), str(go)],
                         capture_output=True, text=True, timeout=120, env=env,
                         stdin=subprocess.DEVNULL, check=True)
    task_id = ran.stdout.strip()
    ui = start_ui(home)
    try:
        yield World(home, task_id, go, ui)
    finally:
        ui.stop()
        subprocess.run([FLOW, "cancel", task_id], capture_output=True, timeout=120, env=env,
                       stdin=subprocess.DEVNULL, check=False)


def test_a_running_task_seen_followed_and_cancelled_in_the_browser(
        world: World, browser: object, monkeypatch: pytest.MonkeyPatch) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 1100})  # type: ignore[attr-defined]
    page.add_init_script(ARRIVALS)
    task_row = f'tr[data-task="{world.task_id}"]'

    # the task list (the first visit carries the token) shows the task, live, RUNNING
    page.goto(world.ui.url)
    page.wait_for_selector(f'{task_row}[data-status="RUNNING"]', timeout=60_000)
    cells = page.locator(f"{task_row} td").all_inner_texts()
    assert cells[0] == world.task_id and cells[3] == "RUNNING" and cells[4] == "2", cells
    assert cells[5] == "local" and cells[7] == "$0.0000", cells
    page.screenshot(path=str(SCREENSHOTS / "tasks.png"), full_page=True)

    # its page: both nodes' phases reach running, and the timeline is drawn, a bar per node
    page.click(f"{task_row} a")
    page.wait_for_function("""() => {
        const phases = [...document.querySelectorAll('#nodes tr[data-node] td.phase')];
        return phases.length === 2 && phases.every((td) => td.textContent === 'running');
    }""", timeout=60_000)
    page.wait_for_function(
        "() => new Set([...document.querySelectorAll('svg.timeline rect.bar')]"
        ".map((r) => r.dataset.node)).size === 2", timeout=30_000)
    assert page.locator('svg.timeline rect.bar[data-phase="agent_up"]').count() == 2

    # a line rank 1 prints appears in the log view within 2 s of the print
    page.wait_for_function(
        "() => [...document.querySelectorAll('#log div.line')].filter("
        "(d) => d.textContent.endsWith(' ready')).length === 2", timeout=30_000)
    world.go.write_text("go")
    page.wait_for_function("() => window.__arrivals.length > 0", timeout=10_000)
    arrived, line = page.evaluate("window.__arrivals[0]")
    printed = float(line.rsplit(" ", 1)[1])
    assert line.startswith("[Node 1] ") and arrived - printed < 2.0, (line, arrived - printed)

    # filtered by rank and searched
    page.select_option("#log-rank", "0")
    page.wait_for_function(
        "() => document.querySelectorAll('#log div.line').length === 1", timeout=10_000)
    assert page.locator("#log div.line").inner_text().endswith("rank 0 ready")
    page.select_option("#log-rank", "")
    page.wait_for_function(
        "() => document.querySelectorAll('#log div.line').length === 3", timeout=10_000)
    page.fill("#log-search", "marker")
    assert page.locator("#log div.line:not(.hidden)").all_inner_texts() == [line]
    page.fill("#log-search", "")
    page.screenshot(path=str(SCREENSHOTS / "task.png"), full_page=True)

    # cancel asks first: the button that cancels shows only once "Cancel task…" is opened
    assert not page.locator("#confirm-cancel").is_visible()
    page.click("#cancel summary")
    page.click("#confirm-cancel")
    page.wait_for_selector('#state-body[data-status="CANCELLED"]', timeout=30_000)
    assert page.locator("#error h2").inner_text().startswith("CANCELLED")
    page.screenshot(path=str(SCREENSHOTS / "cancelled.png"), full_page=True)
    page.close()

    monkeypatch.setenv("FLOW_HOME", str(world.home))
    assert Task.from_id(world.task_id).status is TaskStatus.CANCELLED
    # nothing of the task is left: the only process of this FLOW_HOME is the server itself
    wait_until(lambda: processes_with_env("FLOW_HOME", str(world.home)) == [world.ui.proc.pid],
               10, "the task's processes to end")
    assert alive(world.ui.proc.pid)
