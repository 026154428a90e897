"""Snowflake ML Jobs' names on flow-sdk: each line of the Snowflake table in docs/migration.md
that is not covered by tests/trainers/test_trainers_in_job.py is exercised here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from flow_sdk import ml_jobs
from flow_sdk.data import DataConnector, DataSourceError, ShardedDataConnector
from flow_sdk.errors import TaskNotFoundError, ValidationError
from flow_sdk.spec import build_task_spec
from flow_sdk.client.records import list_client_records
from flow_sdk.trainers import (
    PyTorchDistributor,
    PyTorchScalingConfig,
    WorkerResourceConfig,
    XGBEstimator,
    XGBScalingConfig,
)
from flow_sdk.trainers.pytorch import _stage_as_directory


def noop() -> None:
    return None


@pytest.mark.parametrize(("argument", "hint"), [
    ("compute_pool", "provider="), ("stage_name", "object store"),
    ("pip_requirements", "image="), ("query_warehouse", "DataConnector"),
    ("database", "DataConnector"), ("session", "leave it out")])
def test_snowflake_only_arguments_say_what_to_use(argument: str, hint: str,
                                                   tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("__return__ = 1\n")
    with pytest.raises(ValidationError) as info:
        ml_jobs.submit_file(script, **{argument: "X"})
    assert argument in info.value.fields and hint in str(info.value)
    assert list_client_records() == []  # nothing was launched


@pytest.mark.slow
def test_submit_directory_entry_point_from_the_parent_and_its_return(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "helper.py").write_text("VALUE = 40\n")
    (project / "src" / "main.py").write_text(
        "import os, sys\nimport helper\nprint('mark', os.environ['MARK'], flush=True)\n"
        "__return__ = helper.VALUE + len(sys.argv)\n")
    job = ml_jobs.submit_directory(project, entrypoint="project/src/main.py", args=["a"],
                                   env_vars={"MARK": "x1"}, target_instances=1)
    assert job.id == job.task_id
    assert job.result(timeout=120) == 42
    logs = job.get_logs(instance_id=0)
    assert isinstance(logs, str) and "mark x1" in logs
    assert ml_jobs.get_job(job.id).id == job.id


@pytest.mark.slow
def test_every_worker_mode_returns_every_workers_return(tmp_path: Path) -> None:
    script = tmp_path / "each.py"
    script.write_text("import os\n__return__ = int(os.environ['RANK'])\n")
    job = ml_jobs.submit_file(script, run_on="every_worker", workers_per_node=2)
    assert job.results(timeout=120) == [0, 1]


@pytest.mark.slow
def test_flow_run_run_on_head_runs_the_script_on_node_0_only(tmp_path: Path) -> None:
    script = tmp_path / "head.py"
    script.write_text("import os\nprint('script on rank', os.environ['RANK'], flush=True)\n")
    done = subprocess.run(["flow", "run", "-N", "2", "--run-on", "head", str(script)],
                          capture_output=True, text=True, timeout=180, env=os.environ.copy())
    assert done.returncode == 0, done.stderr[-2000:]
    assert "script on rank 0" in done.stdout and "script on rank 1" not in done.stdout


def test_get_job_of_an_unknown_id_says_how_to_find_one() -> None:
    with pytest.raises(TaskNotFoundError, match="flow list"):
        ml_jobs.get_job("no-such-job")


def test_xgboost_names() -> None:
    estimator = XGBEstimator({"max_depth": 2}, n_estimators=7,
                             scaling_config=XGBScalingConfig(num_workers=-1,
                                                             num_cpu_per_worker=-1))
    assert estimator.num_boost_round == 7
    assert estimator._remote.spec.num_instances == 1  # outside a job: one node
    assert "nthread" not in estimator._worker_params()  # -1: the worker's share of cores
    assert XGBScalingConfig().num_workers == -1  # "what the cluster has" by default
    with pytest.raises(ValidationError, match="n_estimators"):
        XGBEstimator({}, n_estimators=0)


def test_four_gpus_for_one_worker_per_node() -> None:
    config = PyTorchScalingConfig(num_nodes=2, num_workers_per_node=1,
                                  resource_requirements_per_worker=WorkerResourceConfig(
                                      num_cpus=0, num_gpus=4))
    spec = build_task_spec(app="a", name="n", **config.task_options("h100"))
    assert spec.gpu is not None and spec.gpu.count == 4
    assert (spec.slots_per_node, spec.world_size) == (1, 2)


@pytest.mark.parametrize("stage", ["@model_stage", "DB_NAME.SCHEMA_NAME.STAGE_NAME"])
def test_artifact_stage_location_refuses_a_stage_before_launch(stage: str) -> None:
    with pytest.raises(ValidationError, match="artifact_location"):
        PyTorchDistributor(noop).run(artifact_stage_location=stage)
    assert list_client_records() == []


def test_artifact_stage_location_takes_a_directory(tmp_path: Path) -> None:
    assert _stage_as_directory(tmp_path, None) == str(tmp_path)
    with pytest.raises(ValidationError, match="not both"):
        _stage_as_directory(tmp_path, tmp_path)


def test_from_dataframe_takes_pandas_and_explains_snowpark() -> None:
    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0, 6.0]})
    assert DataConnector.from_dataframe(frame).num_rows == 3
    sharded = ShardedDataConnector.from_dataframe(frame)
    assert isinstance(sharded, ShardedDataConnector) and sharded.column_names == ["a", "b"]
    with pytest.raises(DataSourceError, match="from_parquet"):
        DataConnector.from_dataframe(object())  # type: ignore[arg-type]
