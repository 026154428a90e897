"""Real DDP training across 2 local nodes on the local provider.

Each node is a node-agent process on this machine with its own loopback address; the agents
discover each other, pick ranks and a leader, and start one worker per slot with RANK,
WORLD_SIZE, MASTER_ADDR, ... set. The function below is plain torch.distributed code.

On a machine without GPUs (or with ``--cpu``) each node runs 2 CPU workers that see no GPU and
train with gloo. On a machine with GPUs each worker gets a GPU of its own (``gpu="any:N"``:
2 nodes of N = GPUs // 2 GPUs each, or 1 node when there is a single GPU) and trains with NCCL.

    python examples/ddp_local.py [--cpu]
"""

from __future__ import annotations

import argparse
import os

from flow_sdk import FlowApp

app = FlowApp("ddp-local")


@app.function(num_instances=2, workers_per_node=2)
def train(epochs: int = 6, lr: float = 0.05, seed: int = 0) -> dict:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    if torch.cuda.is_available():  # a GPU node: this worker's own GPU of the node's slice
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:  # a CPU node: its workers see no GPU at all
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    # Synthetic regression data, identical on every rank; each rank trains on its own shard.
    data = torch.Generator().manual_seed(1234)
    x = torch.randn(8192, 32, generator=data)
    y = x @ torch.randn(32, 1, generator=data) + 0.05 * torch.randn(8192, 1, generator=data)
    x, y = x[rank::world].to(device), y[rank::world].to(device)

    torch.manual_seed(seed)  # the same initial weights on every rank
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for epoch in range(epochs):
        total = torch.zeros(2, device=device)
        for start in range(0, len(x), 64):
            xb, yb = x[start:start + 64], y[start:start + 64]
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()  # DDP all-reduces the gradients across all ranks here
            opt.step()
            total += torch.stack([loss.detach() * len(xb), torch.tensor(len(xb), device=device)])
        dist.all_reduce(total)
        losses.append(float(total[0] / total[1]))
        if rank == 0:
            print(f"epoch {epoch}: loss={losses[-1]:.4f}", flush=True)
    dist.destroy_process_group()
    return {"final_loss": losses[-1], "losses": losses, "world_size": world}


def gpu_count() -> int:
    """GPUs on this machine (torch asks the driver; no GPU is initialised here)."""
    import torch

    return torch.cuda.device_count()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="CPU workers and gloo, even with GPUs")
    gpus = 0 if parser.parse_args().cpu else gpu_count()
    job, what = train, "2 nodes x 2 CPU workers (gloo)"
    if gpus:
        nodes = 2 if gpus >= 2 else 1
        per_node = gpus // nodes
        job = train.with_options(gpu=f"any:{per_node}", num_instances=nodes, workers_per_node=None)
        what = f"{nodes} node(s) x {per_node} GPU worker(s) (NCCL)"
    task = job.spawn()
    print(f"task {task.task_id}: {what}")
    for line in task.logs(follow=True):
        print(line)
    result = task.result()
    print(f"world_size={result['world_size']} final_loss={result['final_loss']:.4f}")
    losses = result["losses"]
    if result["world_size"] != job.spec.world_size or not losses[-1] < losses[0]:
        raise SystemExit("DDP run did not train as expected")
