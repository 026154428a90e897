"""What `.remote()` shows the caller: the phases on a terminal (a real pty) and rank 0's
output as it is printed (every rank's, labelled, with stream="all"), nothing with quiet=True;
and a restart appears as SDK lines, in the stream and in task.logs()."""

from __future__ import annotations

import io
import re
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from flow_testing import run_on_terminal, wait_until

from flow_sdk import FlowApp, TaskStatus
from flow_sdk.client import progress
from flow_sdk.wire import NodePhase

pytestmark = pytest.mark.slow

CALLER = """
from flow_sdk import FlowApp

app = FlowApp("progress")

@app.function(num_instances=2, {options})
def hello(x):
    import os
    print(f"hello from rank {{os.environ['RANK']}}", flush=True)
    return x + 1

print("result", hello.remote(41))
"""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _caller(tmp_path: Path, options: str) -> list[str]:
    path = tmp_path / "caller.py"
    path.write_text(textwrap.dedent(CALLER.format(options=options)))
    return [sys.executable, str(path)]


def test_remote_shows_phases_and_streams_rank_0_on_a_terminal(tmp_path: Path) -> None:
    code, out = run_on_terminal(_caller(tmp_path, ""))
    text = _ANSI.sub("", out)
    assert code == 0, text
    assert text.index("plan: 2 node(s)") < text.index("provisioning: ") \
        < text.index("running on 2 node(s)") < text.index("hello from rank 0") \
        < text.index("SUCCEEDED") < text.index("result 42")
    assert "hello from rank 1" not in text  # rank 0 only, by default


def test_stream_all_labels_every_rank_and_quiet_shows_nothing(tmp_path: Path) -> None:
    code, out = run_on_terminal(_caller(tmp_path, 'stream="all"'))
    text = _ANSI.sub("", out)
    assert code == 0, text
    assert re.search(r"\[Node 0\] \[\d\d:\d\d:\d\d\] hello from rank 0", text)
    assert re.search(r"\[Node 1\] \[\d\d:\d\d:\d\d\] hello from rank 1", text)
    code, out = run_on_terminal(_caller(tmp_path, "quiet=True"))
    assert code == 0 and out.strip() == "result 42", out


app = FlowApp("restart-events")


@app.function(num_instances=2, max_restarts=1, restart_on="any", quiet=True)
def fails_once() -> int:
    from flow_sdk import current

    if current.node_index == 1 and current.restart_count == 0:
        raise SystemExit(5)
    return current.restart_count


def test_a_restart_shows_as_sdk_lines_in_task_logs() -> None:
    task = fails_once.spawn()
    assert task.result(timeout=120) == 1
    assert task.status is TaskStatus.SUCCEEDED
    events = [ln for ln in task.logs() if "] [flow] " in ln]
    assert any("generation 0 failed" in ln and "restart 1 of 1" in ln for ln in events), events
    assert any("generation 1 is starting (restart 1 of at most 1)" in ln for ln in events)
    entries = [e for e in task.log_entries() if e["kind"] == "flow"]
    assert entries and all(e["rank"] is None and e["node"] in (0, 1) for e in entries)


def test_caller_options_are_validated_at_decoration() -> None:
    from flow_sdk import ValidationError

    def work() -> None:
        return None

    for bad in ({"stream": "rank1"}, {"quiet": "yes"}, {"confirm": 0}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            app.function(**bad)(work)
    assert app.function(stream="all", quiet=True)(work).watch.stream == "all"


@FlowApp("ended-early").function(num_instances=2, quiet=True, stream="all")
def _says_hello() -> int:
    import os
    print(f"hello from rank {os.environ['RANK']}", flush=True)
    return 1


def test_a_task_that_ended_before_the_first_poll_still_shows_its_phases_and_lines() -> None:
    """A short task can run and end between two polls of the phases: the caller is still shown
    that it ran, and every line it printed."""
    task = _says_hello.spawn()
    wait_until(lambda: task.status.is_terminal, 120, "the task's end")
    err, out = io.StringIO(), io.StringIO()
    assert progress.watch(task, progress.Reporter(err=err), "all", out=out) \
        is TaskStatus.SUCCEEDED
    assert "running on 2 node(s)" in err.getvalue()
    assert sorted(line.split("] ")[-1] for line in out.getvalue().splitlines()) == [
        "hello from rank 0", "hello from rank 1"]


class _Joining:
    """A 2-node task whose second node has passed the start barrier but not yet written that
    its workers start, then both run the caller's code."""

    def __init__(self) -> None:
        self.polls = [[("importing your code", NodePhase.RUNNING)],
                      [("running your code", NodePhase.RUNNING)] * 2]
        self.status = TaskStatus.RUNNING

    def nodes(self) -> list[SimpleNamespace]:
        shown = self.polls.pop(0) if len(self.polls) > 1 else self.polls[0]
        return [SimpleNamespace(activity=a, phase=p) for a, p in shown]


def test_workers_count_the_nodes_not_yet_starting_them_among_the_tasks_nodes() -> None:
    err = io.StringIO()
    progress.wait_workers(cast(Any, _Joining()), progress.Reporter(err=err), 2)
    said = [ln.split(" flow: ", 1)[1].rsplit(" [", 1)[0] for ln in err.getvalue().splitlines()]
    assert said == ["running on 2 node(s): workers starting (1/2 node(s))",
                    "running on 2 node(s): workers running your code"]
