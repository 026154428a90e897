"""examples/ddp_checkpoint_resume.py: a seeded 2-node x 2-worker DDP job on a file volume is
killed after a checkpoint, resumed from ``latest_checkpoint``, and ends with exactly the
weights of an uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from volumes_helpers import flow_processes

from flow_sdk.volumes import Volume, checkpoint_step, list_checkpoints

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 5


@pytest.mark.slow
def test_killed_run_resumes_to_the_weights_of_an_uninterrupted_run(flow_home: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "ddp_checkpoint_resume.py"),
         "--epochs", str(EPOCHS), "--kill-after", "1"],
        capture_output=True, text=True, timeout=400, check=False, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 1 <= summary["killed_at_epoch"] < EPOCHS - 1  # killed mid-training
    assert summary["resumed_from"] == summary["killed_at_epoch"] + 1
    assert summary["identical"] is True and summary["max_abs_diff"] == 0.0
    volume = Volume("ddp-ckpt").local_path
    resumed = list_checkpoints(volume / summary["run"])
    assert [checkpoint_step(p) for p in resumed] == list(range(EPOCHS))
    assert flow_processes(flow_home) == []
