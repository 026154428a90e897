"""A torchrun-style DDP script (the shape of PyTorch's DDP tutorial): it saves `snapshot.pt`
to a relative path and, when the file is there on start, resumes from it.

    torchrun --nnodes 2 --nproc-per-node 2 ... ddp_snapshot.py EPOCHS PAUSE_S
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

SNAPSHOT = "snapshot.pt"
epochs, pause_s = int(sys.argv[1]), float(sys.argv[2])

dist.init_process_group(backend="gloo")
rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
world_size = int(os.environ["WORLD_SIZE"])

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
start = torch.zeros(1, dtype=torch.int64)
if os.path.exists(SNAPSHOT):
    snapshot = torch.load(SNAPSHOT)
    model.load_state_dict(snapshot["model"])
    start[0] = snapshot["epoch"] + 1
    print(f"rank {rank}: resuming from snapshot at epoch {snapshot['epoch']} (restart "
          f"{os.environ['TORCHELASTIC_RESTART_COUNT']} of "
          f"{os.environ['TORCHELASTIC_MAX_RESTARTS']})", flush=True)
ddp = DDP(model)  # rank 0's weights go to every rank
dist.broadcast(start, src=0)  # and so does its epoch
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
true_w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])

for epoch in range(int(start.item()), epochs):
    generator = torch.Generator().manual_seed(epoch * world_size + rank)
    for _ in range(4):
        x = torch.randn(32, 4, generator=generator)
        loss = torch.nn.functional.mse_loss(ddp(x), x @ true_w)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if local_rank == 0:  # one snapshot per node, next to the script
        torch.save({"model": model.state_dict(), "epoch": epoch}, SNAPSHOT + ".tmp")
        os.replace(SNAPSHOT + ".tmp", SNAPSHOT)
    print(f"rank {rank}: epoch {epoch} loss {loss.item():.6f}", flush=True)
    time.sleep(pause_s)

weights = [float(v) for p in model.parameters() for v in p.detach().flatten()]
if rank == 0:
    print("final weights: " + json.dumps(weights), flush=True)
dist.destroy_process_group()
__return__ = weights
