"""A node's working directory lives as long as the task on that node: a torchrun-style DDP
script that saves `snapshot.pt` to a relative path, run with
`flow run -N 2 --workers-per-node 2 --max-restarts 1`, has a worker killed after its first
snapshot; every rank resumes from the snapshot on its own node and the run ends with the
weights of an uninterrupted run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from flow_testing import wait_until, worker_pids
from flow_sdk.providers.local import LocalProvider
from flow_sdk.client.task import Task

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("scripts") / "ddp_snapshot.py"
EPOCHS = 6


def _flow_run(pause_s: float, output: Path, *extra: str) -> subprocess.Popen[bytes]:
    with open(output, "wb") as sink:
        return subprocess.Popen(
            ["flow", "run", "-N", "2", "--workers-per-node", "2", *extra, str(SCRIPT),
             str(EPOCHS), str(pause_s)],
            stdout=sink, stderr=subprocess.STDOUT, env=os.environ.copy())


def _final_weights(text: str) -> list[float]:
    lines = [ln for ln in text.splitlines() if "final weights: " in ln]
    assert len(lines) == 1, text[-3000:]
    weights: list[float] = json.loads(lines[0].split("final weights: ", 1)[1])
    return weights


def _finish(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_killed_worker_resumes_from_its_relative_snapshot(flow_home: Path, tmp_path: Path
                                                          ) -> None:
    out = tmp_path / "elastic.log"
    proc = _flow_run(0.7, out, "--max-restarts", "1")
    snapshots: list[Path] = []

    def both_nodes_saved() -> bool:
        snapshots[:] = sorted(flow_home.rglob("code/snapshot.pt"))
        return len(snapshots) == 2

    wait_until(both_nodes_saved, 180, "a snapshot on each node")
    task_id = snapshots[0].parents[2].name  # nodes/<task id>/<instance id>/code/snapshot.pt
    task = Task.from_id(task_id)
    provider = task.provider
    assert isinstance(provider, LocalProvider)
    node1 = next(n.instance_id for n in task.nodes() if n.node == 1)
    os.kill(worker_pids(provider, task_id, node1)[0], signal.SIGKILL)  # rank 2, which saved
    assert _finish(proc, 300) == 0, out.read_text()[-3000:]
    text = out.read_text()

    resumed = [ln for ln in text.splitlines() if "resuming from snapshot at epoch" in ln]
    assert {re.search(r"rank (\d+): resuming", ln).group(1)  # type: ignore[union-attr]
            for ln in resumed} == {"0", "1", "2", "3"}
    assert all("(restart 1 of 1)" in ln for ln in resumed)
    assert "rank 3: epoch 0 loss" in text  # generation 0 ran before the kill
    assert task.record().spec["max_restarts"] == 1

    reference_out = tmp_path / "reference.log"
    reference = _flow_run(0.0, reference_out)
    assert _finish(reference, 300) == 0, reference_out.read_text()[-3000:]
    assert "resuming" not in reference_out.read_text()  # a new task starts with a new folder
    assert _final_weights(text) == _final_weights(reference_out.read_text())
