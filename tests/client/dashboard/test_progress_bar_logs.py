"""A real tqdm loop in a local task, followed live by ``flow logs -f`` (the console script, in
a subprocess) and by the dashboard's log stream (a real ``flow ui``, its ``lines`` events over
HTTP): every update of the bar arrives as a line of its own and nothing raises. A line that
forges another node's label with escape sequences is shown escaped, after its real label;
colour stays only with ``flow logs --color``; a stream an older node left with bare carriage
returns still reads."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from dashboard_testing import FLOW, Ui, start_ui
from flow_testing import wait_until

from flow_sdk import FlowApp
from flow_sdk.client.dashboard.auth import COOKIE

pytestmark = pytest.mark.slow

app = FlowApp("progress-logs")
STEPS = 20
LABEL = re.compile(r"^\[Node 0\] \[\d\d:\d\d:\d\d\] ")
BAR = re.compile(rf"^ *\d+%\|[^|]*\| (\d+)/{STEPS} \[")
FORGED_SHOWN = ("\\x1b[2K\\x1b[1G[Node 1] fake \\x1b]0;title\\x07 \\x1b]8;;http://x\\x07link"
                "\\x1b]8;;\\x07 ")


@app.function(num_instances=1)
def progress(go_dir: str, steps: int) -> int:
    """A line that forges node 1's label, then 'ready'; at the go file, a tqdm bar that draws
    every update (each after a carriage return, on stderr), then one more line."""
    import sys
    import time
    from pathlib import Path

    from tqdm import tqdm

    print("\x1b[2K\x1b[1G[Node 1] fake \x1b]0;title\x07 \x1b]8;;http://x\x07link\x1b]8;;\x07 "
          "\x1b[31mred\x1b[0m", flush=True)
    print("ready", flush=True)
    go = Path(go_dir) / "go"
    while not go.exists():
        time.sleep(0.01)
    for _ in tqdm(range(steps), mininterval=0, miniters=1, ncols=60, ascii=True,
                  file=sys.stderr):
        time.sleep(0.05)
    print("after the bar", flush=True)
    return steps


class _Follow(threading.Thread):
    """Collects the lines one follower delivers, in a thread of its own."""

    def __init__(self, source: Any) -> None:
        super().__init__(daemon=True)
        self.source = source
        self.lines: list[str] = []
        self.kinds: list[str] = []

    def saw(self, text: str) -> bool:
        return any(line.endswith(text) for line in list(self.lines))


class _CliFollow(_Follow):
    def run(self) -> None:
        for line in self.source.stdout:
            self.lines.append(line.rstrip("\n"))


class _PageFollow(_Follow):
    """The dashboard's ``/events/logs/TASK`` stream: its ``lines`` events until ``end``."""

    def run(self) -> None:
        ui, task_id = self.source
        conn = http.client.HTTPConnection("127.0.0.1", ui.port, timeout=90)
        conn.request("GET", f"/events/logs/{task_id}",
                     headers={"Host": ui.host, "Cookie": f"{COOKIE}={ui.token}"})
        response = conn.getresponse()
        assert response.status == 200
        event = ""
        for raw in response:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
                if event == "end":
                    break
            elif line.startswith("data:") and event == "lines":
                for _node, _rank, kind, text in json.loads(line.split(":", 1)[1]):
                    self.kinds.append(kind)
                    self.lines.append(text)
        conn.close()


def _check_followed(lines: list[str]) -> None:
    """Every line labelled node 0, inert; the forged one escaped after its real label; every
    update of the bar a line of its own, in order."""
    assert lines, "nothing arrived"
    assert all(LABEL.match(line) for line in lines), lines
    assert not any(re.search("[\x00-\x08\x0a-\x1f\x7f-\x9f]", line) for line in lines), lines
    texts = [LABEL.sub("", line) for line in lines]
    assert texts[0] == FORGED_SHOWN + "\\x1b[31mred\\x1b[0m"
    assert texts[1] == "ready" and texts[-1] == "after the bar"
    bar = texts[2:-1]
    counts = [int(m[1]) for m in map(BAR.match, bar) if m]
    assert len(counts) == len(bar), bar  # each line one update, nothing else
    assert all(text.count(f"/{STEPS}") == 1 for text in bar), bar
    assert counts == sorted(counts) and set(counts) == set(range(STEPS + 1)), counts


def test_a_progress_bar_followed_by_the_cli_and_the_page(flow_home: Path,
                                                        tmp_path: Path) -> None:
    task = progress.spawn(str(tmp_path), STEPS)
    ui: Ui = start_ui(flow_home)
    follower = subprocess.Popen([FLOW, "logs", task.task_id, "-f"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        cli, page = _CliFollow(follower), _PageFollow((ui, task.task_id))
        cli.start()
        page.start()
        wait_until(lambda: cli.saw(" ready") and page.saw(" ready"), 60,
                   "both followers to see 'ready'")
        (tmp_path / "go").write_text(f"{time.time():.6f}")  # the bar starts while followed
        assert task.result(timeout=60) == STEPS
        assert follower.wait(timeout=30) == 0  # the follow ends with the task, no error
        page.join(timeout=30)
        assert not page.is_alive(), "the page's stream did not end with the task"
    finally:
        if not task.status.is_terminal:
            task.cancel()
        if follower.poll() is None:
            follower.kill()
        follower.wait(timeout=10)
        assert ui.stop() == 130  # Ctrl-C's exit code
    assert follower.stderr is not None and follower.stderr.read() == ""
    _check_followed(cli.lines)
    _check_followed(page.lines)
    assert page.lines == cli.lines and set(page.kinds) == {"worker"}

    printed = subprocess.run([FLOW, "logs", task.task_id], capture_output=True, text=True,
                             timeout=60, check=True)
    assert printed.stdout.splitlines() == cli.lines  # read again after the end: the same
    coloured = subprocess.run([FLOW, "logs", task.task_id, "--color"], capture_output=True,
                              text=True, timeout=60, check=True).stdout.splitlines()
    assert LABEL.sub("", coloured[0]) == FORGED_SHOWN + "\x1b[31mred\x1b[0m\x1b[0m"
    assert coloured[1:] == cli.lines[1:]

    # a stream an older node wrote with bare carriage returns (and a line with no time)
    stream = flow_home / "local" / "logs" / task.task_id / "node-0.rank-0.log"
    with open(stream, "ab") as fh:
        fh.write(f"{time.time():.6f}\t 10%|#\r 20%|##\x0b\x1c\x85\n".encode())
        fh.write(b"no time\n")
    later = subprocess.run([FLOW, "logs", task.task_id, "--tail", "2"], capture_output=True,
                           text=True, timeout=60)
    assert later.returncode == 0, later.stderr
    assert [LABEL.sub("", line) for line in later.stdout.splitlines()] == [
        " 10%|#\\x0d 20%|##\\x0b\\x1c\\x85", "no time"]
