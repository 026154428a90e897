"""Snowflake's job model: a script submitted with Snowflake's names runs on the head of a
3-node job; XGBEstimator and PyTorchDistributor called in it span the job's 3 nodes, no second
task is created, and the script's __return__ is the job's result."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from flow_sdk import ml_jobs

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("scripts") / "snowflake_job.py"
FLOW = "flow"


def test_head_only_job_runs_both_trainers_on_its_own_nodes(flow_home: Path) -> None:
    job = ml_jobs.submit_file(SCRIPT, target_instances=3)
    result = job.result(timeout=420)

    assert result["xgb"] == [(0, 0, 3), (1, 1, 3), (2, 2, 3)]  # (rank, node, world size)
    assert result["rounds"] == 4
    torch_runs = result["torch"]
    assert [(r["rank"], r["node"], r["world_size"]) for r in torch_runs] == [
        (0, 0, 3), (1, 1, 3), (2, 2, 3)]
    assert {r["sum"] for r in torch_runs} == {6.0}  # 1 + 2 + 3: one process group of 3
    assert {r["task"] for r in torch_runs} == {job.id}
    assert Path(result["model_dir"]).is_absolute()

    listed = subprocess.run([FLOW, "list", "--json"], capture_output=True, text=True,
                            check=True, env=os.environ.copy())
    assert [row["task_id"] for row in json.loads(listed.stdout)] == [job.id]

    head_log = job.get_logs(instance_id=0)
    assert isinstance(head_log, str) and "xgboost trained on 3 workers" in head_log
    assert "pytorch ran on 3 workers" in head_log
    assert "xgboost trained" not in job.get_logs(instance_id=1)  # the script ran on the head
    assert ml_jobs.get_job(job.id).result() == result
    assert job.results(timeout=10)[1:] == [None, None]  # the other workers served the head
