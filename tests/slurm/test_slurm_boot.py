"""A node that never starts its agent on the test runner's real Slurm cluster: what its
bootstrap said is its boot stream (``task.logs(source="boot")``) and leads the task's error,
and where even the bootstrap could not start, the end of Slurm's own output of the job does."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from flow_sdk import FlowApp, current
from flow_sdk.errors import TaskError
from flow_sdk.wire import TaskStatus
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow
TIMEOUT_S = 120


def rank() -> int:
    return current.rank


def _app(cluster: SlurmCluster, shared: Path, monkeypatch: pytest.MonkeyPatch,
         **config: object) -> FlowApp:
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    return FlowApp("slurm-boot", provider="slurm",
                   provider_config={"shared_dir": str(shared), **config})


def test_a_failed_bootstrap_is_the_nodes_boot_stream_and_leads_the_error(
        slurm_clean: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "envs").write_text("not a folder")  # where the node environments are built
    app = _app(slurm_clean, shared, monkeypatch)
    task = app.function(num_instances=2, max_run_time_hours=0.1)(rank).spawn()
    assert task.wait(timeout=TIMEOUT_S) is TaskStatus.FAILED
    boot = task.logs(source="boot")
    for node in (0, 1):
        assert any(f"[Node {node}]" in line and "slurm boot: failed on node" in line
                   for line in boot), boot
    assert any("FileExistsError" in line for line in boot), boot
    with pytest.raises(TaskError) as raised:
        task.result()
    message = str(raised.value)
    assert "ended FAILED" in message and "last boot output" in message, message
    assert "FileExistsError" in message


def test_a_node_that_cannot_start_the_bootstrap_shows_slurms_output(
        slurm_clean: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'this site has no python here' >&2\nexit 3\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    app = _app(slurm_clean, tmp_path / "shared", monkeypatch, python=str(broken))
    task = app.function(num_instances=2, max_run_time_hours=0.1)(rank).spawn()
    assert task.wait(timeout=TIMEOUT_S) is TaskStatus.FAILED
    with pytest.raises(TaskError) as raised:
        task.result()
    message = str(raised.value)
    assert "ended FAILED" in message and "the end of Slurm's output of the job" in message
    assert "this site has no python here" in message, message
