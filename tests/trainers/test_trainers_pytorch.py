"""PyTorchDistributor on the local provider: real node agents, real gloo DDP."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from flow_sdk import Task, TaskStatus, TaskTimeoutError
from flow_sdk.data import DataConnector, ShardedDataConnector
from flow_sdk.trainers.pytorch import (
    ARTIFACT_VOLUME,
    PyTorchDistributor,
    PyTorchScalingConfig,
    WorkerResourceConfig,
    get_context,
)
from flow_sdk.volumes import Volume

pytestmark = pytest.mark.slow

ROWS = 4_096
COLUMNS = ("a", "b", "c")


def train_func() -> dict[str, Any]:
    """DDP linear regression on this worker's shard; rank 0 saves ``model.pt``."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    context = get_context()
    dist.init_process_group("gloo")
    params = context.get_hyper_params()
    shard = context.get_dataset_map()["train"].get_shard()
    dataset = shard.to_torch_dataset(batch_size=params["batch_size"])
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(len(params["columns"]), 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=params["lr"])
    ids: list[int] = []
    for epoch in range(params["epochs"]):
        for batch in dataset:
            x = torch.stack([batch[c] for c in params["columns"]], dim=1)
            loss = torch.nn.functional.mse_loss(model(x), batch["y"].unsqueeze(1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if epoch == 0:
                ids.extend(batch["id"].tolist())
    model_dir = context.get_model_dir()
    if context.get_rank() == 0:
        torch.save(model.module.state_dict(), os.path.join(model_dir, "model.pt"))
    dist.barrier()  # the file is complete before any rank returns
    dist.destroy_process_group()
    return {"rank": context.get_rank(), "local_rank": context.get_local_rank(),
            "world_size": context.get_world_size(), "node_rank": context.get_node_rank(),
            "local_world_size": context.get_local_world_size(),
            "num_nodes": context.get_num_nodes(), "model_dir": model_dir,
            "model_dir_exists": os.path.isdir(model_dir), "hyper_params": params,
            "datasets": sorted(context.get_dataset_map()), "ids": ids,
            "weight": model.module.weight.detach().flatten().tolist(),
            "loss": float(loss)}


def _dataset() -> ShardedDataConnector:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((ROWS, len(COLUMNS))).astype(np.float32)
    y = x @ np.array([1.5, -2.0, 0.5], dtype=np.float32) + 0.01 * rng.standard_normal(ROWS)
    table = pa.table({"id": np.arange(ROWS), **{c: x[:, i] for i, c in enumerate(COLUMNS)},
                      "y": y.astype(np.float32)})
    return ShardedDataConnector.from_arrow(table)


HYPER = {"lr": 0.1, "epochs": 3, "batch_size": 128, "columns": list(COLUMNS)}


def test_2x2_run_saves_rank0_model_where_get_model_dir_points(flow_home: Path) -> None:
    distributor = PyTorchDistributor(train_func, PyTorchScalingConfig(
        num_nodes=2, num_workers_per_node=2,
        resource_requirements_per_worker=WorkerResourceConfig(num_cpus=1)))
    response = distributor.run(dataset_map={"train": _dataset(),
                                            "unused": DataConnector.from_arrow(pa.table(
                                                {"z": [1.0]}))},
                               hyper_params=HYPER)

    # rank 0's file is in the directory the response names, on this machine
    model_dir = Path(response.get_model_dir())
    assert model_dir == Volume(ARTIFACT_VOLUME).local_path / "model" / response.task_id
    state = torch.load(model_dir / "model.pt")
    assert set(state) == {"weight", "bias"} and state["weight"].shape == (1, len(COLUMNS))
    results = sorted(response.results, key=lambda r: r["rank"])
    assert response.result == results[0]
    assert state["weight"].flatten().tolist() == pytest.approx(results[0]["weight"])
    assert state["weight"].flatten().tolist() == pytest.approx([1.5, -2.0, 0.5], abs=0.05)

    # every rank's context: its place, the run's hyper-parameters and model dir
    for rank, seen in enumerate(results):
        node, local = divmod(rank, 2)
        assert (seen["rank"], seen["node_rank"], seen["local_rank"]) == (rank, node, local)
        assert (seen["world_size"], seen["local_world_size"], seen["num_nodes"]) == (4, 2, 2)
        assert seen["hyper_params"] == HYPER and seen["datasets"] == ["train", "unused"]
        assert seen["model_dir_exists"]
        assert seen["model_dir"].endswith(f"/model/{response.task_id}")
        # DDP kept the replicas identical
        assert seen["weight"] == pytest.approx(results[0]["weight"], abs=1e-6)
    # get_shard() gave each rank a disjoint quarter of the rows, together all of them
    shards = [set(seen["ids"]) for seen in results]
    assert [len(s) for s in shards] == [ROWS // 4] * 4
    assert set().union(*shards) == set(range(ROWS))


def failing_func() -> None:
    if get_context().get_rank() == 1:
        raise ValueError("bad batch on rank 1")


def test_artifact_location_and_a_failing_worker(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    distributor = PyTorchDistributor(train_func, PyTorchScalingConfig(num_nodes=2))
    response = distributor.run({"train": _dataset()}, HYPER, artifact_location=artifacts)
    assert response.get_model_dir() == str(artifacts / "model" / response.task_id)
    assert (artifacts / "model" / response.task_id / "model.pt").is_file()
    assert [r["world_size"] for r in response.results] == [2, 2]

    with pytest.raises(ValueError, match="bad batch on rank 1") as info:
        PyTorchDistributor(failing_func, PyTorchScalingConfig(num_nodes=1,
                                                              num_workers_per_node=2)).run()
    assert info.value.__cause__ is not None  # the remote traceback


def sleeping_func() -> None:
    import time

    time.sleep(300)


def test_a_run_past_its_timeout_is_cancelled_leaving_nothing_running(flow_home: Path) -> None:
    distributor = PyTorchDistributor(sleeping_func, PyTorchScalingConfig(num_nodes=2),
                                     timeout_s=3)
    with pytest.raises(TaskTimeoutError):
        distributor.run()
    # the task was cancelled; the flow_home fixture fails the test if any process is left
    (record,) = (flow_home / "tasks").glob("*.json")
    assert Task.from_id(record.stem).status is TaskStatus.CANCELLED
