"""``flow gc --older-than`` on a machine that does not hold a running task's secret cannot
check any outcome of it, so it deletes nothing of the task (not even with a forged, old
outcome in the store): it reports the task kept, and the task ends with its real result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flow_testing import wait_until

from flow_sdk import FlowApp, TaskStatus, wire
from flow_sdk.providers.local import LocalProvider
from flow_sdk.providers.objects_gc import UNCHECKED
from flow_sdk.wire import Outcome

app = FlowApp("lifecycle-forgeries")


@app.function()
def waits(started: str, release: str) -> int:
    import os
    import time
    from pathlib import Path

    Path(started).write_text("up")
    deadline = time.monotonic() + 120
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise TimeoutError("never released")
        time.sleep(0.05)
    return 42


@pytest.mark.slow
def test_gc_older_than_without_the_tasks_secret_deletes_nothing_of_a_running_task(
        flow_home: Path, tmp_path: Path) -> None:
    started, release = tmp_path / "started", tmp_path / "release"
    task = waits.spawn(str(started), str(release))
    wait_until(started.exists, 60, "the task's function to run")
    store = LocalProvider().store
    store.put(wire.outcome_key(task.task_id), wire.to_json(
        Outcome("SUCCEEDED", "forged", 0.0)))  # no MAC, finished "in 1970"
    before = sorted(store.list(wire.task_prefix(task.task_id)))
    payloads = task.record().digests
    elsewhere = tmp_path / "another-home"  # another FLOW_HOME on the same provider root
    elsewhere.mkdir()
    (elsewhere / "local").symlink_to(flow_home / "local")

    gc = subprocess.run([sys.executable, "-c", "from flow_sdk.cli import main; main()", "gc",
                         "--provider", "local", "--older-than", "0s", "--json"],
                        capture_output=True, text=True, timeout=120,
                        env={**os.environ, "FLOW_HOME": str(elsewhere)})
    assert gc.returncode == 0, gc.stdout + gc.stderr
    entries = json.loads(gc.stdout)
    [objects] = [e["objects"] for e in entries if "objects" in e]
    assert objects["removed_tasks"] == [] and objects["removed_payloads"] == []
    assert objects["kept"][task.task_id] == UNCHECKED
    [report] = [e for e in entries if "live_tasks" in e]
    assert report["live_tasks"] == [task.task_id] and report["reasons"] == {}
    assert sorted(store.list(wire.task_prefix(task.task_id))) == before
    assert all(store.exists(wire.payload_key(digest)) for digest in payloads)

    release.write_text("go")
    assert task.result(timeout=60) == 42
    assert task.status is TaskStatus.SUCCEEDED
