"""Queueing on the real Slurm cluster: a job that waits shows Slurm's reason in the progress
line, ``flow status``, ``flow list`` and the dashboard's rows, and the task fails once it has
waited longer than ``availability_timeout_s`` (its job cancelled); ``min_instances`` lets Slurm
start the job on the nodes it has."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from flow_sdk import FlowApp, current
from flow_sdk.cli import main
from flow_sdk.client.dashboard import pages
from flow_sdk.client.overview import status_data, task_rows
from flow_sdk.client.progress import Reporter, wait_running
from flow_sdk.errors import TaskError
from flow_sdk.wire import TaskStatus
from flow_testing import wait_until
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow
TIMEOUT_S = 120
BUSY = "queued by Slurm: Resources (the nodes it needs are busy)"


def world() -> int:
    return current.world_size


def test_a_queued_job_shows_slurms_reason_then_fails_after_availability_timeout(
        app: FlowApp, slurm_clean: SlurmCluster, every_node_busy: str) -> None:
    function = app.function(num_instances=2, max_run_time_hours=0.1,
                            availability_timeout_s=15)(world)
    task = function.spawn()
    wait_until(lambda: task.waiting() == BUSY, 30, "Slurm's reason")
    assert task.status is TaskStatus.PROVISIONING
    assert status_data(task)["waiting"] == BUSY
    shown = CliRunner().invoke(main, ["status", task.task_id])
    assert BUSY in shown.output, shown.output
    listed = CliRunner().invoke(main, ["list"])
    assert f"PROVISIONING ({BUSY})" in listed.output, listed.output
    as_json = json.loads(CliRunner().invoke(main, ["list", "--json"]).output)
    assert as_json[0]["waiting"] == BUSY
    row = task_rows()[0]
    assert row.waiting == BUSY and BUSY in str(pages.tasks_page([row], [], None, None))

    err = io.StringIO()
    assert wait_running(task, Reporter(err=err)) is TaskStatus.FAILED
    assert f"provisioning: 0/2 nodes up; {BUSY}" in err.getvalue()
    assert task.wait(timeout=TIMEOUT_S) is TaskStatus.FAILED
    with pytest.raises(TaskError, match="never started") as raised:
        task.result()
    assert "availability_timeout_s" in str(raised.value) and "Resources" in str(raised.value)
    # the job was cancelled: only the holding job is left
    assert slurm_clean.run("squeue", "-h", "-o", "%i").stdout.split() == [every_node_busy]


def test_min_instances_starts_on_the_nodes_slurm_has_without_waiting_out_the_clock(
        app: FlowApp, slurm_clean: SlurmCluster, one_node_busy: str) -> None:
    function = app.function(num_instances=3, min_instances=2, max_run_time_hours=0.1)(world)
    task = function.spawn()  # availability_timeout_s stays 300 s: the test must not wait it
    assert task.results(timeout=TIMEOUT_S) == [2, 2]
    states = [i.state for i in task.provider.list_instances(task.task_id)]
    assert states == ["terminated"] * 3
    slurm_clean.run("scancel", one_node_busy)
    wait_until(lambda: not slurm_clean.run("squeue", "-h").stdout.strip(), 30, "a free node")
    assert function.spawn().results(timeout=TIMEOUT_S) == [3, 3, 3]  # all it asked, when free
