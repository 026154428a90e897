"""The runtime cap is enforced on the nodes: it holds when the caller is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import processes_with_env, wait_until
from flow_sdk import Task, TaskStatus

pytestmark = pytest.mark.slow


def test_runtime_cap_holds_when_the_caller_is_killed_right_after_spawn(
        tmp_path: Path, flow_home: Path) -> None:
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent("""
        import time
        from flow_sdk import FlowApp

        app = FlowApp("caps")

        @app.function(num_instances=2, max_run_time_hours=6 / 3600)
        def forever():
            print("working", flush=True)
            time.sleep(3600)

        task = forever.spawn()
        print(task.task_id, flush=True)
        time.sleep(3600)   # the caller would wait; it gets killed instead
    """))
    caller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "FLOW_HOME": str(flow_home)})
    assert caller.stdout is not None
    task_id = caller.stdout.readline().strip()
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    task = Task.from_id(task_id)
    wait_until(lambda: task.outcome() is not None, 60, "the nodes to end the task on their own")
    assert task.status is TaskStatus.TIMED_OUT
    # nothing was torn down by a client: the nodes stopped themselves
    wait_until(lambda: not processes_with_env("FLOW_HOME", str(flow_home)), 15,
               "every node process to exit")
    assert any("working" in line for line in task.logs())
