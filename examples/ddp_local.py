"""Real DDP training across 2 nodes x 2 workers on the local provider.

Each node is a node-agent process on this machine with its own loopback address; the agents
discover each other, pick ranks and a leader, and start one worker per slot with RANK,
WORLD_SIZE, MASTER_ADDR, ... set. The function below is plain torch.distributed code.

    python examples/ddp_local.py
"""

from __future__ import annotations

from flow_sdk import FlowApp

app = FlowApp("ddp-local")


@app.function(num_instances=2, workers_per_node=2)
def train(epochs: int = 6, lr: float = 0.05, seed: int = 0) -> dict:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")

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
            loss.backward()  # DDP all-reduces the gradients across all 4 ranks here
            opt.step()
            total += torch.stack([loss.detach() * len(xb), torch.tensor(len(xb), device=device)])
        dist.all_reduce(total)
        losses.append(float(total[0] / total[1]))
        if rank == 0:
            print(f"epoch {epoch}: loss={losses[-1]:.4f}", flush=True)
    dist.destroy_process_group()
    return {"final_loss": losses[-1], "losses": losses, "world_size": world}


if __name__ == "__main__":
    task = train.spawn()
    print(f"task {task.task_id}: 2 nodes x 2 workers")
    for line in task.logs(follow=True):
        print(line)
    result = task.result()
    print(f"world_size={result['world_size']} final_loss={result['final_loss']:.4f}")
    if result["world_size"] != 4 or not result["losses"][-1] < result["losses"][0]:
        raise SystemExit("DDP run did not train as expected")
