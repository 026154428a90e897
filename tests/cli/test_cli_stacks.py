"""``flow stacks`` on local tasks: a hung rank's stack reads as a traceback does (the user's own
file, line and source line, for a function shipped by value and for a script), and so do the
stall line and the dashboard; an ended task shows the stacks it kept (a stall's), or says
that none were taken."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from flow_testing import wait_until

from flow_sdk import FlowApp, Task, TaskFailedError
from flow_sdk.client.dashboard import taskpage
from flow_sdk.client.dashboard.views import stall_views, task_state

pytestmark = pytest.mark.slow

_BESIDE = Path(sys.executable).with_name("flow")
FLOW = str(_BESIDE) if _BESIDE.exists() else (shutil.which("flow") or "flow")
app = FlowApp("stacks")
PAIR = {"num_instances": 1, "workers_per_node": 2, "quiet": True}


def flow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLOW, *args], capture_output=True, text=True, timeout=120,
                          check=False, stdin=subprocess.DEVNULL)


def _waits_for(flag: str) -> int:
    import os
    import time

    print("up", flush=True)
    while not os.path.exists(flag):
        time.sleep(0.2)
    return 5


def _frame(file: str, function: str, source: str) -> str:
    """A frame as a traceback prints it, at the line of ``source`` in ``file``."""
    line = Path(file).read_text().splitlines().index(f"        {source}") + 1
    return f'  File "{file}", line {line}, in {function}\n    {source}\n'


def _both_up(task: Task) -> None:
    wait_until(lambda: sum(ln.endswith("up") for ln in task.logs()) == 2, 90, "both ranks up")


def test_stalled_functions_stacks_stall_line_and_page_name_their_file_line_and_source(
        tmp_path: Path) -> None:
    """Two tasks at once (they share nothing): one warns on its stall, one fails on it."""
    failing = app.function(**PAIR, stall_timeout="3s", on_stall="fail")(_waits_for).spawn(
        str(tmp_path / "never"))
    try:
        _a_hung_functions_stacks_stall_line_and_page_name_its_file_line_and_source(tmp_path)
        _on_stall_fail_keeps_the_stacks_that_flow_stacks_shows_once_the_task_ended(failing)
    finally:
        if not failing.status.is_terminal:
            failing.cancel()


def _a_hung_functions_stacks_stall_line_and_page_name_its_file_line_and_source(
        tmp_path: Path) -> None:
    flag = tmp_path / "go"
    task = app.function(**PAIR, stall_timeout="3s", on_stall="warn")(_waits_for).spawn(
        str(flag))
    frame = _frame(__file__, "_waits_for", "time.sleep(0.2)")
    file_line = frame.splitlines()[0].removeprefix("  File ").replace(", in _waits_for", "")
    try:
        _both_up(task)
        wait_until(lambda: any("stall: rank(s)" in ln for ln in task.logs()), 60, "a stall line")
        [stall] = [ln for ln in task.logs() if "stall: rank(s)" in ln]
        assert f"(_waits_for at {file_line}: time.sleep(0.2))" in stall, stall
        shown = flow("stacks", task.task_id)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.count(frame) == 2, shown.stdout  # rank 0 and rank 1
        assert "<dynamic-code>" not in shown.stdout and "flow_sdk/" not in shown.stdout
        assert "flow-sdk frames left out" in shown.stdout
        page = str(taskpage.state_html(task_state(task)))
        assert stall_views(task) and page.count(frame.rstrip().replace('"', "&#34;")) == 2
    finally:
        flag.touch()
    assert task.result(timeout=60) == 5
    kept = flow("stacks", task.task_id)
    assert kept.returncode == 0, kept.stderr
    assert f"task {task.task_id} has ended (SUCCEEDED); its last stacks, taken at" in kept.stdout
    assert kept.stdout.count(frame) == 2, kept.stdout


MYTRAIN = """
import os
import time

print("up", flush=True)
while not os.path.exists(os.environ["GO_FLAG"]):
    time.sleep(0.2)
"""


def test_a_hung_scripts_stacks_name_the_script_its_line_and_source(tmp_path: Path) -> None:
    script = tmp_path / "mytrain.py"
    script.write_text(textwrap.dedent(MYTRAIN))
    flag = tmp_path / "go"
    started = flow("run", "-d", "--workers-per-node", "2", "--env", f"GO_FLAG={flag}",
                   str(script))
    assert started.returncode == 0, started.stderr
    task = Task.from_id(started.stdout.strip())
    try:
        _both_up(task)
        shown = flow("stacks", task.task_id)
        assert shown.returncode == 0, shown.stderr
        line = MYTRAIN.splitlines().index("    time.sleep(0.2)") + 1
        assert shown.stdout.count(f'mytrain.py", line {line}, in <module>\n'
                                  "    time.sleep(0.2)\n") == 2, shown.stdout
        assert "flow_sdk/" not in shown.stdout and "runpy" not in shown.stdout
    finally:
        flag.touch()
    assert task.result(timeout=60) is None


def _on_stall_fail_keeps_the_stacks_that_flow_stacks_shows_once_the_task_ended(
        task: Task) -> None:
    with pytest.raises(TaskFailedError) as raised:
        task.result(timeout=120)
    frame = _frame(__file__, "_waits_for", "time.sleep(0.2)")
    assert frame in str(raised.value), str(raised.value)
    kept = flow("stacks", task.task_id)
    assert kept.returncode == 0, kept.stderr
    assert f"task {task.task_id} has ended (FAILED); its last stacks, taken at" in kept.stdout
    assert "made no progress" in kept.stdout.splitlines()[0]  # the stall took them
    assert kept.stdout.count(frame) == 2, kept.stdout


def _returns() -> int:
    return 3


def test_an_ended_task_without_stacks_says_none_were_taken() -> None:
    task = app.function(quiet=True)(_returns).spawn()
    assert task.result(timeout=60) == 3
    started = time.monotonic()
    shown = flow("stacks", task.task_id)
    assert shown.returncode != 0 and time.monotonic() - started < 30
    assert f"task {task.task_id} has ended (SUCCEEDED) and no stacks were taken while it " \
           "ran" in shown.stderr, shown.stderr
