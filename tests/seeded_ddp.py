"""A seeded DDP training run for recovery tests: rank 0 checkpoints every step into a folder
every node sees, a restarted generation resumes from it, and the run returns the final
weights, which equal an uninterrupted run's."""

from __future__ import annotations

import os
import time
from pathlib import Path


def train(steps: int, folder: str) -> list[float]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ckpt = Path(folder) / "ckpt.pt"
    start = 0
    if ckpt.exists():
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        start = saved["step"]
    for step in range(start, steps):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step * 100 + rank))
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "step": step + 1}, ckpt.with_suffix(".tmp"))
            os.replace(ckpt.with_suffix(".tmp"), ckpt)
            print(f"step {step + 1}", flush=True)
        dist.barrier()
        time.sleep(0.2)
    weights = [float(v) for v in torch.cat([p.detach().flatten() for p in model.parameters()])]
    dist.destroy_process_group()
    return weights
