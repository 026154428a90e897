"""PyTorchDistributor: DDP on 2 local nodes x 2 workers, the model saved by rank 0.

A synthetic regression dataset is written to parquet and passed as a ``ShardedDataConnector``;
inside ``train_func`` each worker takes its shard with ``get_shard()``, streams it through
``to_torch_dataset`` and trains a small MLP with DDP (gloo on CPU, nccl with GPUs). Rank 0
saves ``model.pt`` into ``get_context().get_model_dir()``; afterwards this script loads it
from ``response.get_model_dir()`` and evaluates it on held-out rows.

    python examples/pytorch_distributor.py [--nodes 2] [--workers-per-node 2] [--epochs 5]
                                           [--artifact-location DIR]

Without ``--artifact-location`` the model lands on the file volume ``flow-trainer-artifacts``.
Exit code 0 when the loaded model beats predicting the mean by a wide margin.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from flow_sdk.trainers.pytorch import get_context

INPUT_COLS = [f"x{i}" for i in range(8)]
LABEL_COL = "y"


def make_model(inputs: int) -> Any:
    from torch import nn

    return nn.Sequential(nn.Linear(inputs, 32), nn.ReLU(), nn.Linear(32, 1))


def train_func() -> dict[str, Any]:
    """Runs on every worker: DDP over this worker's shard; rank 0 saves the model."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    context = get_context()
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device("cuda", context.get_local_rank()) if use_cuda else torch.device("cpu")
    params = context.get_hyper_params()
    dataset = context.get_dataset_map()["train"].get_shard().to_torch_dataset(
        batch_size=params["batch_size"], shuffle=True, seed=0)

    torch.manual_seed(0)  # the same initial weights on every rank
    model = DDP(make_model(len(INPUT_COLS)).to(device))
    optimizer = torch.optim.Adam(model.parameters(), lr=params["lr"])
    for epoch in range(params["epochs"]):
        dataset.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for batch in dataset:  # {column: tensor}, one batch per item
            features = torch.stack([batch[c] for c in INPUT_COLS], dim=1).to(device)
            labels = batch[LABEL_COL].unsqueeze(1).to(device)
            loss = torch.nn.functional.mse_loss(model(features), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(labels),
                                  torch.tensor(float(len(labels)), device=device)])
        dist.all_reduce(total)
        if context.get_rank() == 0:
            print(f"epoch {epoch}: loss={float(total[0] / total[1]):.4f}", flush=True)
    if context.get_rank() == 0:
        torch.save(model.module.state_dict(), os.path.join(context.get_model_dir(), "model.pt"))
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": context.get_rank(), "node": context.get_node_rank(),
            "local_rank": context.get_local_rank(), "world_size": context.get_world_size()}


def write_dataset(folder: Path, rows: int, seed: int = 0) -> tuple[Path, Any, Any]:
    """train.parquet (16 row groups) and held-out (features, labels) as numpy."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows + rows // 5, len(INPUT_COLS))).astype(np.float32)
    y = (x[:, 0] * 2 - x[:, 1] + np.tanh(x[:, 2] * x[:, 3])
         + 0.1 * rng.standard_normal(len(x))).astype(np.float32)
    table = pa.table({**{c: x[:rows, i] for i, c in enumerate(INPUT_COLS)}, LABEL_COL: y[:rows]})
    path = folder / "train.parquet"
    pq.write_table(table, path, row_group_size=max(1, rows // 16))
    return path, x[rows:], y[rows:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--workers-per-node", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=32_000)
    parser.add_argument("--artifact-location", default=None)
    args = parser.parse_args(argv)

    import torch

    from flow_sdk.data import ShardedDataConnector
    from flow_sdk.trainers.pytorch import (
        PyTorchDistributor,
        PyTorchScalingConfig,
        WorkerResourceConfig,
    )

    distributor = PyTorchDistributor(train_func, scaling_config=PyTorchScalingConfig(
        num_nodes=args.nodes, num_workers_per_node=args.workers_per_node,
        resource_requirements_per_worker=WorkerResourceConfig(num_cpus=1, num_gpus=0)))
    with tempfile.TemporaryDirectory(prefix="flow-torch-example-") as folder:
        path, x_test, y_test = write_dataset(Path(folder), args.rows)
        response = distributor.run(
            dataset_map={"train": ShardedDataConnector.from_parquet(path)},
            hyper_params={"lr": 3e-3, "epochs": args.epochs, "batch_size": 256},
            artifact_location=args.artifact_location)
    for line in response.task.logs(node=0):
        print(line)
    model_file = os.path.join(response.get_model_dir(), "model.pt")
    model = make_model(len(INPUT_COLS))
    model.load_state_dict(torch.load(model_file))
    with torch.no_grad():
        mse = float(torch.nn.functional.mse_loss(model(torch.from_numpy(x_test)).squeeze(1),
                                                 torch.from_numpy(y_test)))
    baseline = float(((y_test - y_test.mean()) ** 2).mean())
    print(f"task {response.task_id}: {len(response.results)} workers "
          f"({args.nodes} nodes x {args.workers_per_node})")
    print(f"rank 0 saved {model_file}")
    print(f"held-out mse {mse:.4f} (predicting the mean: {baseline:.4f})")
    return 0 if mse < 0.2 * baseline else 1


if __name__ == "__main__":
    sys.exit(main())
