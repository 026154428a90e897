"""The examples of Flow's multi-node guide, run on the local provider with the import changed
(``from flow_sdk import ...``) on 2 CPU nodes: ``gloo`` for ``nccl``, no ``.cuda()``, no
``gpu=``. The guide leaves its helpers (``create_model``, ``train_epoch``,
``load_dataset_from_path``, ``load_dataset_from_s3_mount``) to the reader: they are defined
here, small and real (a linear model trained by DDP).

Paths the examples write to go through ``current.path``, which is the literal path wherever a
node has a private mount namespace (as here, when the runner may make one) and the mapped
directory elsewhere; the S3 example's body is unchanged: its helper resolves ``/data``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from flow_testing import fake_aws_environment, moto_server, processes_with_env, results_or_cancel
from torch.nn.parallel import DistributedDataParallel as DDP

from flow_sdk import Flow, FlowApp, Task, TaskStatus, current
from flow_sdk.client.records import list_client_records
from flow_sdk.volumes import Volume, create_volume

pytestmark = pytest.mark.slow

app = FlowApp()
ROWS = 16


# -- the helpers the guide leaves undefined ---------------------------------------------------


def create_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def _synthetic() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(ROWS, 5)


def train_epoch(model: torch.nn.Module, dataset: torch.Tensor | None = None,
                lr: float = 0.05) -> float:
    """One pass over ``dataset`` (columns: 4 features, 1 target), each rank its half."""
    data = _synthetic() if dataset is None else dataset
    shard = data[dist.get_rank()::dist.get_world_size()]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(shard[:, :4]), shard[:, 4:])
    loss.backward()  # DDP all-reduces the gradients over gloo
    optimizer.step()
    return float(loss.item())


def load_dataset_from_path(path: Path) -> torch.Tensor:
    dataset: torch.Tensor = torch.load(current.path(path / "dataset.pt"))
    return dataset


def load_dataset_from_s3_mount(path: str) -> torch.Tensor:
    """The CSV objects under the mount (``current.path`` finds it on any node)."""
    root = current.path(path)
    rows = []
    for name in sorted(os.listdir(root)):
        with open(os.path.join(root, name)) as fh:
            rows += [[float(x) for x in line.split(",")] for line in fh if line.strip()]
    print(f"read {len(rows)} rows from {root} ({', '.join(sorted(os.listdir(root)))})",
          flush=True)
    return torch.tensor(rows)


# -- "From single-node to multi-node": the two added parameters -------------------------------


@app.function(
    num_instances=2,
    distributed_mode="auto",
    image="nvcr.io/nvidia/pytorch:23.10-py3",
)
def distributed_training() -> dict[str, Any]:
    node_rank = int(os.environ["FLOW_NODE_RANK"])
    num_nodes = int(os.environ["FLOW_NUM_NODES"])
    main_ip = os.environ["FLOW_MAIN_IP"]
    print(f"Node {node_rank}/{num_nodes} - Master: {main_ip}")
    dist.init_process_group(backend="gloo")
    model = create_model()
    model = DDP(model)
    for epoch in range(10):
        loss = train_epoch(model)
        if dist.get_rank() == 0:
            print(f"Epoch {epoch}: loss={loss:.4f}")
    return {"node": node_rank, "status": "complete"}


@pytest.fixture(scope="module")
def ddp_task(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """``distributed_training.remote()``, run once under a FLOW_HOME of its own: its value and
    that FLOW_HOME. The two tests below read the same ended task (the guide's conversion
    section, then its log aggregation), each with its FLOW_HOME set to that one."""
    home = tmp_path_factory.mktemp("guide-ddp-home")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FLOW_HOME", str(home))
        result = distributed_training.remote()
    yield home, result
    assert processes_with_env("FLOW_HOME", str(home)) == []  # nothing of it outlived it


def _ddp_task_by_id(ddp_task: tuple[Path, dict[str, Any]],
                    monkeypatch: pytest.MonkeyPatch) -> Task:
    """The task ``ddp_task`` ran, found by the id this machine recorded for it."""
    monkeypatch.setenv("FLOW_HOME", str(ddp_task[0]))
    [record] = list_client_records()
    return Flow().get_task(record["task_id"])


def test_two_parameter_conversion_trains_with_ddp_on_two_nodes(
        ddp_task: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    _, result = ddp_task
    assert result == {"node": 0, "status": "complete"}
    task = _ddp_task_by_id(ddp_task, monkeypatch)
    lines = task.logs()
    main_ip = next(ln for ln in lines if "Node 0/2 - Master: " in ln).rsplit(" ", 1)[1]
    assert main_ip.startswith("127.")
    assert any(ln.startswith("[Node 1]") and f"Node 1/2 - Master: {main_ip}" in ln
               for ln in lines)
    losses = [float(ln.rsplit("=", 1)[1]) for ln in lines if "Epoch " in ln]
    assert len(losses) == 10 and losses[-1] < losses[0]  # DDP trained across both nodes


# -- "Log aggregation": get_task(id).logs(), logs(node=1), logs(follow=True) -------------------


def test_logs_of_a_task_found_by_id_every_node_one_node_and_followed(
        ddp_task: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    task = _ddp_task_by_id(ddp_task, monkeypatch)
    assert task.status is TaskStatus.SUCCEEDED
    logs = task.logs()
    assert {" ".join(ln.split(" ", 2)[:2]) for ln in logs} == {"[Node 0]", "[Node 1]"}
    node_1_logs = task.logs(node=1)
    assert node_1_logs and all(ln.startswith("[Node 1] [") for ln in node_1_logs)
    assert any("Node 1/2 - Master: " in ln for ln in node_1_logs)
    streamed = [line for line in task.logs(follow=True)]  # ends with the task
    assert streamed == logs


# -- "Shared storage": file volumes seen by every node ----------------------------------------


@app.function(
    num_instances=2,
    volumes={
        "/shared/datasets": {"name": "training-data", "size_gb": 1000, "interface": "file"},
        "/shared/checkpoints": {"name": "model-checkpoints", "size_gb": 500,
                                "interface": "file"},
    },
)
def training_with_shared_storage() -> dict[str, Any]:
    import os
    from pathlib import Path

    node_rank = int(os.environ["FLOW_NODE_RANK"])
    datasets_path = Path("/shared/datasets")
    checkpoints_path = current.path(Path("/shared/checkpoints"))
    dist.init_process_group(backend="gloo")
    dataset = load_dataset_from_path(datasets_path)
    model = create_model()
    model = DDP(model)
    for epoch in range(10):
        train_epoch(model, dataset)
        if node_rank == 0:
            checkpoint_path = checkpoints_path / f"epoch_{epoch}.pt"
            torch.save(model.state_dict(), checkpoint_path)
            print(f"Checkpoint saved: {checkpoint_path}")
        dist.barrier()
    return {"epochs_completed": 10, "checkpoints_saved": True}


def test_shared_volumes_feed_both_nodes_and_keep_node_0s_checkpoints() -> None:
    create_volume("training-data", 1000, "file")
    torch.save(_synthetic(), Volume("training-data").local_path / "dataset.pt")
    result = training_with_shared_storage.remote()
    assert result == {"epochs_completed": 10, "checkpoints_saved": True}
    saved = Volume("model-checkpoints").local_path
    assert sorted(p.name for p in saved.iterdir()) == sorted(f"epoch_{i}.pt" for i in range(10))
    weights = torch.load(saved / "epoch_9.pt")
    assert set(weights) == {"module.weight", "module.bias"}
    assert not torch.equal(weights["module.weight"], create_model().weight.detach())


# -- "S3 dataset integration": Flow().run(..., mounts=...) from the simulated cloud's S3 -------


@app.function(
    num_instances=2,
    distributed_mode="auto",
)
def training_with_s3_data() -> dict[str, Any]:
    dataset_path = "/data"
    dist.init_process_group(backend="gloo")
    dataset = load_dataset_from_s3_mount(dataset_path)
    model = create_model()
    model = DDP(model)
    for epoch in range(10):
        train_epoch(model, dataset)
    return {"training": "complete"}


def test_s3_mount_through_flow_run_reads_the_simulated_clouds_s3(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_aws_environment(monkeypatch, tmp_path)
    with moto_server() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)  # local nodes inherit it
        import boto3
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        s3.create_bucket(Bucket="ml-datasets")
        body = "\n".join(",".join(f"{v:.4f}" for v in row) for row in _synthetic().tolist())
        s3.put_object(Bucket="ml-datasets", Key="imagenet/part-0.csv", Body=body.encode())
        s3.put_object(Bucket="ml-datasets", Key="other/ignored.csv", Body=b"9,9,9,9,9\n")

        flow = Flow()
        task = flow.run(
            training_with_s3_data._build_task_config(""),
            mounts={"/data": "s3://ml-datasets/imagenet"},
        )
        assert results_or_cancel(task, timeout=180) == [{"training": "complete"}] * 2
    assert task.task_id.startswith("training-with-s3-data-")
    again = flow.get_task(task.task_id)
    assert again.spec.mounts == {"/data": "s3://ml-datasets/imagenet"}
    assert (again.num_instances, again.max_price_per_hour) == (2, None)  # uncapped
    for node in (0, 1):
        [line] = [ln for ln in again.logs(node=node) if "read " in ln]
        assert f"read {ROWS} rows from " in line and "(part-0.csv)" in line


# -- "Cost protection": the caps, read back from the task -------------------------------------


@app.function(
    num_instances=2,
    priority="med",
    max_price_per_hour=50.0,
    max_run_time_hours=12,
    image="nvcr.io/nvidia/pytorch:24.01-py3",
    environment={
        "NCCL_DEBUG": "WARN",
        "NCCL_TREE_THRESHOLD": "0",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    },
)
def production_training(learning_rate: float = 1e-4, batch_size: int = 32) -> dict[str, Any]:
    dist.init_process_group(backend="gloo")
    world_size = dist.get_world_size()
    model = DDP(create_model())
    for _ in range(3):
        epoch_loss = train_epoch(model, lr=learning_rate)
    print(f"learning_rate={learning_rate} batch_size={batch_size} "
          f"NCCL_DEBUG={os.environ['NCCL_DEBUG']}", flush=True)
    return {"final_loss": epoch_loss, "epochs": 100, "gpus_used": world_size}


def test_production_caps_read_back_as_the_guide_prints_them() -> None:
    task = production_training.spawn(learning_rate=5e-5)
    assert f"Current cost: ${task.estimated_cost:.2f}" == "Current cost: $0.00"  # local nodes
    cap = f"Cost cap: ${task.max_price_per_hour * task.num_instances:.2f}/hour"
    assert cap == "Cost cap: $100.00/hour"
    results = results_or_cancel(task, timeout=180)
    assert [r["gpus_used"] for r in results] == [2, 2]
    assert results[0]["final_loss"] > 0 and results[0]["epochs"] == 100
    assert task.spec.max_run_time_hours == 12 and task.spec.priority == "med"
    assert any("learning_rate=5e-05 batch_size=32 NCCL_DEBUG=WARN" in ln for ln in task.logs())
