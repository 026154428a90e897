"""Forged objects under a task's stalls (junk bytes, another secret's seal, unsealed JSON, a
sealed record of the wrong shape, a forged stack dump) break neither ``flow status`` nor the
task's page: both show the one stall its leader recorded, and nothing of the forgeries."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from dashboard_testing import FLOW, request, start_ui

from flow_sdk import FlowApp
from flow_sdk.client.dashboard import views
from flow_sdk.client.dashboard.auth import COOKIE
from flow_sdk.client.stacks import task_stalls
from flow_sdk.wire import signing
from flow_sdk.wire.stacks import StallRecord, stack_dump_key, stall_key, stalls_prefix

pytestmark = pytest.mark.slow

app = FlowApp("forged-stalls")
FORGED_WORDS = ("another seal", "unsealed", "misshapen", "junk bytes")


@app.function(num_instances=1)
def quick() -> int:
    return 7


def test_forged_stall_objects_break_neither_status_nor_the_page(flow_home: Path) -> None:
    task = quick.spawn()
    assert task.result(timeout=60) == 7
    store, raw = task.store, task.store.raw
    genuine = StallRecord(1, [0], [0], 31.0, 30.0, 1, "warn",
                          "rank 0 made no progress for 31s", time.time())
    store.put_record(stall_key(task.task_id, 1), genuine)
    raw.put(stall_key(task.task_id, 2), b"\x00\xff junk bytes")
    signing.SignedStore(raw, signing.secret_from_hex(signing.new_secret())).put_record(
        stall_key(task.task_id, 3), replace(genuine, number=3, message="forged: another seal"))
    raw.put(stall_key(task.task_id, 4), json.dumps(
        {**asdict(genuine), "number": 4, "message": "unsealed"}).encode())
    store.put_record(stall_key(task.task_id, 5), {  # sealed, of the wrong shape
        **asdict(genuine), "number": "five", "ranks": "all", "message": "misshapen"})
    raw.put(stalls_prefix(task.task_id) + "x", b"{}")
    raw.put(stack_dump_key(task.task_id, 1, 0), b"forged dump")  # the genuine stall's stacks

    assert task_stalls(task) == [genuine]
    state = views.task_state(task)
    assert [(v.stall, v.dumps) for v in state.stalls] == [(genuine, [])]

    shown = subprocess.run([FLOW, "status", task.task_id], capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr  # SUCCEEDED
    assert genuine.summary() in shown.stdout and shown.stderr == ""
    assert not any(word in shown.stdout for word in FORGED_WORDS)
    as_json = subprocess.run([FLOW, "status", task.task_id, "--json"], capture_output=True,
                             text=True, timeout=60)
    assert json.loads(as_json.stdout)["stalls"] == [genuine.summary()]

    ui = start_ui(flow_home)
    try:
        page = request(ui, f"/tasks/{task.task_id}", {"Cookie": f"{COOKIE}={ui.token}"})
    finally:
        ui.stop()
    assert page.status == 200
    assert genuine.message in page.body
    assert not any(word in page.body for word in FORGED_WORDS)
