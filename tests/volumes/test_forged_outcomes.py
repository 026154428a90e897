"""A junk outcome for a running task that uses a local volume and an S3 mount: the volume
stays in use (``flow volumes delete`` refuses), junk task records never crash ``flow volumes
list``, the task's S3 mount cache stays, and the task ends with its real result."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from volumes_helpers import wait_for

from flow_sdk import FlowApp, TaskStatus, wire
from flow_sdk.providers.local import LocalProvider
from flow_sdk.node.volumes.prepare import gc_mount_caches
from flow_sdk.volumes import VolumeInUseError, delete_volume
from flow_sdk.wire import Outcome, TaskRecord

pytestmark = pytest.mark.slow

app = FlowApp("forged-outcomes")


@app.function(volumes={"/shared/forged": {"name": "forged", "size_gb": 1}},
              mounts={"/data": "s3://flow-volumes-test/forged"})
def waits(started: str, release: str) -> str:
    import os
    import time
    from pathlib import Path

    from flow_sdk import current

    Path(started).write_text("up")
    deadline = time.monotonic() + 120
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise TimeoutError("never released")
        time.sleep(0.05)
    with open(current.path("/data/one.txt")) as fh:
        return fh.read()


def _flow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from flow_sdk.cli import main; main()",
                           *args], capture_output=True, text=True, timeout=120)


def test_a_junk_outcome_leaves_the_volume_in_use_and_the_mount_cache_kept(
        flow_home: Path, tmp_path: Path, s3_env: str, s3_data: dict[str, Any]) -> None:
    s3_data["client"].put_object(Bucket=s3_data["bucket"], Key="forged/one.txt",
                                 Body=b"the real result")
    started, release = tmp_path / "started", tmp_path / "release"
    task = waits.spawn(str(started), str(release))
    wait_for(started.exists, 90, "the task's function to run")
    store = LocalProvider().store
    store.put(wire.outcome_key(task.task_id), wire.to_json(
        Outcome("SUCCEEDED", "forged", time.time())))  # no MAC: a store writer's
    store.put("tasks/junk-a/task.json", b"\xff not json")
    store.put("tasks/junk-b/task.json", b'{"spec": []}')
    genuine = store.get(wire.task_key(task.task_id))
    assert genuine is not None
    record = TaskRecord.from_json(genuine)
    store.put(wire.task_key(task.task_id), wire.to_json(TaskRecord(  # names no volume
        task.task_id, {**record.spec, "volumes": {}}, record.payload_digest,
        record.created_at, record.rdzv_port, record.master_port)))

    listed = _flow("volumes", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [v["in_use_by"] for v in json.loads(listed.stdout)] == [[task.task_id]]
    refused = _flow("volumes", "delete", "forged", "--yes")
    assert refused.returncode != 0
    assert f"used by running task(s) {task.task_id}" in refused.stderr
    with pytest.raises(VolumeInUseError, match=task.task_id):
        delete_volume("forged")
    cache = flow_home / "local" / "cache" / "s3" / task.task_id
    assert gc_mount_caches(LocalProvider()) == 0 and cache.is_dir()
    store.put(wire.task_key(task.task_id), genuine)

    release.write_text("go")
    assert task.result(timeout=60) == "the real result"
    assert task.status is TaskStatus.SUCCEEDED
    assert (flow_home / "local" / "volumes" / "forged").is_dir()  # never deleted under it
    assert delete_volume("forged") is True  # the task ended: the volume is free
