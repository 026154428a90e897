"""Trainer configuration, checked before launch; the tracker-port exchange; lazy imports."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from trainers_helpers import FEATURES, LABEL, regression_table

from flow_sdk import ValidationError
from flow_sdk.data import ColumnNotFoundError, DataConnector
from flow_sdk.system.procs import free_port
from flow_sdk.trainers import (
    PyTorchDistributor,
    PyTorchScalingConfig,
    TrainerError,
    WorkerResourceConfig,
    XGBEstimator,
    XGBScalingConfig,
    get_context,
)
from flow_sdk.trainers._collective import (
    CollectiveConfig,
    _PortServer,
    fetch_tracker_port,
)


def _nothing_launched(flow_home: Path) -> None:
    assert not (flow_home / "tasks").exists()
    assert not (flow_home / "local" / "instances").exists()


def noop() -> None:
    return None


@pytest.mark.parametrize(("build", "field"), [
    (lambda: XGBScalingConfig(num_workers=0), "scaling_config.num_workers"),
    (lambda: XGBScalingConfig(num_workers=2.0), "scaling_config.num_workers"),  # type: ignore[arg-type]
    (lambda: XGBScalingConfig(num_workers=True), "scaling_config.num_workers"),
    (lambda: XGBScalingConfig(num_workers=5000), "scaling_config.num_workers"),
    (lambda: XGBScalingConfig(num_cpu_per_worker=0), "scaling_config.num_cpu_per_worker"),
    (lambda: XGBScalingConfig(use_gpu="yes"), "scaling_config.use_gpu"),  # type: ignore[arg-type]
    (lambda: PyTorchScalingConfig(num_nodes=0), "scaling_config.num_nodes"),
    (lambda: PyTorchScalingConfig(num_workers_per_node=-1),
     "scaling_config.num_workers_per_node"),
    (lambda: PyTorchScalingConfig(num_workers_per_node=17,
                                  resource_requirements_per_worker=WorkerResourceConfig(
                                      num_gpus=1)), "scaling_config.num_workers_per_node"),
    (lambda: WorkerResourceConfig(num_gpus=17),
     "scaling_config.resource_requirements_per_worker.num_gpus"),
    (lambda: WorkerResourceConfig(num_cpus=-2),
     "scaling_config.resource_requirements_per_worker.num_cpus"),
    (lambda: PyTorchScalingConfig(resource_requirements_per_worker={"num_gpus": 1}),  # type: ignore[arg-type]
     "scaling_config.resource_requirements_per_worker"),
    (lambda: XGBEstimator({}, num_boost_round=0), "num_boost_round"),
    (lambda: XGBEstimator({}, scaling_config=PyTorchScalingConfig()), "scaling_config"),  # type: ignore[arg-type]
    (lambda: XGBEstimator({}, function_options={"num_instances": 3}),
     "function_options.num_instances"),
    (lambda: XGBEstimator({}, function_options={"max_run_time_hours": -1}),
     "max_run_time_hours"),
    (lambda: XGBEstimator({}, function_options={"gpuz": "h100"}), "gpuz"),
    (lambda: XGBEstimator({}, 10, XGBScalingConfig(use_gpu=True), gpu_type="h9000"), "gpu"),
    (lambda: PyTorchDistributor(noop, XGBScalingConfig()), "scaling_config"),  # type: ignore[arg-type]
    (lambda: PyTorchDistributor("train.py"), "train_func"),  # type: ignore[arg-type]
    (lambda: PyTorchDistributor(noop, function_options={"workers_per_node": 4}),
     "function_options.workers_per_node"),
])
def test_bad_configs_are_rejected_naming_the_field_before_launch(
        build: Any, field: str, flow_home: Path) -> None:
    with pytest.raises(ValidationError) as info:
        build()
    assert field in info.value.fields, str(info.value)
    _nothing_launched(flow_home)


def test_scaling_configs_become_launch_options() -> None:
    estimator = XGBEstimator({"max_depth": 3}, 10, XGBScalingConfig(3, 2),
                             function_options={"environment": {"MARK": "x"}})
    spec = estimator._remote.spec
    assert (spec.num_instances, spec.slots_per_node, spec.distributed_mode) == (3, 1, "auto")
    assert spec.environment == {"MARK": "x"}
    assert estimator._worker_params() == {"max_depth": 3, "nthread": 2}

    gpu = XGBEstimator({}, 10, XGBScalingConfig(2, use_gpu=True), gpu_type="a100")
    assert gpu._remote.spec.gpu is not None and gpu._remote.spec.gpu.count == 1
    assert gpu._worker_params()["device"] == "cuda"

    distributor = PyTorchDistributor(noop, PyTorchScalingConfig(
        num_nodes=2, num_workers_per_node=4,
        resource_requirements_per_worker=WorkerResourceConfig(num_cpus=3, num_gpus=1)),
        function_options={"environment": {"OMP_NUM_THREADS": "5"}})
    spec = distributor._remote.spec
    assert spec.num_instances == 2 and spec.world_size == 8
    assert spec.gpu is not None and spec.gpu.count == 4 and spec.gpu.model == "h100"
    assert spec.environment == {"OMP_NUM_THREADS": "5"}  # the caller's value wins
    cpu = PyTorchDistributor(noop, PyTorchScalingConfig(1, 2, WorkerResourceConfig(num_cpus=3)))
    assert cpu._remote.spec.gpu is None and cpu._remote.spec.environment == {
        "OMP_NUM_THREADS": "3"}


def test_fit_checks_columns_and_inputs_before_launch(flow_home: Path, tmp_path: Path) -> None:
    data = DataConnector.from_arrow(regression_table(100, seed=0))
    estimator = XGBEstimator({}, 5, XGBScalingConfig(2))
    with pytest.raises(ColumnNotFoundError, match="missing_col"):
        estimator.fit(data, [*FEATURES, "missing_col"], LABEL)
    with pytest.raises(ColumnNotFoundError, match="eval_set"):
        estimator.fit(data, FEATURES, LABEL,
                      eval_set=DataConnector.from_arrow(pa.table({"f0": [1.0]})))
    with pytest.raises(ValidationError, match="label_col"):
        estimator.fit(data, [*FEATURES, LABEL], LABEL)
    with pytest.raises(ValidationError, match="input_cols"):
        estimator.fit(data, "f0", LABEL)
    with pytest.raises(ValidationError, match="dataset"):
        estimator.fit([1, 2, 3], FEATURES, LABEL)
    one_group = tmp_path / "one-group.parquet"
    pq.write_table(regression_table(100, seed=0), one_group)
    with pytest.raises(ValidationError, match="without rows") as info:
        estimator.fit(data, FEATURES, LABEL, eval_set=DataConnector.from_parquet(one_group))
    assert info.value.fields == ["eval_set"]
    with pytest.raises(ValidationError, match="dataset_map"):
        PyTorchDistributor(noop).run(dataset_map={"train": "/data/train.parquet"})
    _nothing_launched(flow_home)


def test_out_of_order_use_raises_trainer_error() -> None:
    with pytest.raises(TrainerError, match="fit\\(\\) first"):
        XGBEstimator({}).get_booster()
    with pytest.raises(TrainerError, match="inside a train_func"):
        get_context()


def test_importing_the_trainers_imports_neither_torch_nor_xgboost() -> None:
    code = ("import sys, flow_sdk, flow_sdk.trainers\n"
            "from flow_sdk.trainers import XGBEstimator, PyTorchDistributor, get_context\n"
            "print(sorted(m for m in ('torch', 'xgboost', 'pyarrow', 'pandas') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert json.loads(out.stdout.replace("'", '"')) == []


def _config(rank: int, port: int, token: str = "task-1", timeout_s: float = 10.0
            ) -> CollectiveConfig:
    return CollectiveConfig(rank=rank, world_size=3, leader_ip="127.0.0.1",
                            exchange_port=port, token=token, timeout_s=timeout_s)


def test_port_exchange_serves_late_and_early_clients_and_ignores_strangers() -> None:
    port = free_port()
    got: dict[int, int] = {}
    early = threading.Thread(target=lambda: got.__setitem__(1, fetch_tracker_port(
        _config(1, port))))
    early.start()  # asks before rank 0 listens: it retries until the answer comes
    stranger = _config(2, port, token="another-task", timeout_s=1.0)
    server = _PortServer("127.0.0.1", port, "task-1", {"port": 41234}, clients=2)
    try:
        with pytest.raises(TrainerError, match="no XGBoost tracker port from rank 0"):
            fetch_tracker_port(stranger)
        got[2] = fetch_tracker_port(_config(2, port))
        early.join(timeout=10)
    finally:
        server.close()
    assert got == {1: 41234, 2: 41234}


def test_port_exchange_times_out_naming_the_leader() -> None:
    port = free_port()
    with pytest.raises(TrainerError, match=f"127.0.0.1:{port} within 1s"):
        fetch_tracker_port(_config(1, port, timeout_s=1.0))
