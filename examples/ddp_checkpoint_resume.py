"""Checkpoint to a shared volume, get killed, resume: the same final weights as a clean run.

Seeded DDP (gloo) on 2 local nodes x 2 workers with a file volume at /shared/ckpt:

1. a first run is cancelled (every process killed) once its checkpoint of epoch
   ``--kill-after`` is on the volume;
2. a second run of the same job resumes from ``latest_checkpoint`` and finishes;
3. a reference run trains uninterrupted from scratch;

and the final weights of 2 and 3 are compared: they are bit-for-bit identical. Checkpoints
are written by rank 0 under a temporary name and renamed into place, and every rank waits at a
barrier (``flow_sdk.volumes.save_checkpoint``), so a kill never leaves a half-written
checkpoint.

Why the job sums gradients in rank order (``ordered_allreduce``): DDP lays gradients out in
buckets and rebuilds that layout after the first iteration of every process group, and a
ring all-reduce adds the ranks' values in an order that depends on where a value sits in its
bucket. A resumed run's first iteration therefore rounds differently from the uninterrupted
run's (the weights then differ by ~1e-7). Gathering the buckets and adding them in rank order
makes the sum independent of the layout, so resuming is exact. Drop the hook for plain DDP
(results then agree to ~1e-7 rather than exactly).

    python examples/ddp_checkpoint_resume.py [--epochs 8] [--kill-after 2]

The last line printed is a JSON summary; the exit code is 0 when the weights are identical.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from typing import TYPE_CHECKING, Any

from flow_sdk import FlowApp, TaskStatus
from flow_sdk.volumes import Volume, checkpoint_step, latest_checkpoint

if TYPE_CHECKING:  # the client never imports torch; the workers do
    import torch
    from torch._C._distributed_c10d import GradBucket

app = FlowApp("ddp-checkpoint-resume")
CKPT = "/shared/ckpt"
VOLUME = Volume("ddp-ckpt", size_gb=10, interface="file")


def ordered_allreduce(state: object, bucket: GradBucket
                      ) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: the mean of every rank's gradients, added in rank order."""
    import torch
    import torch.distributed as dist

    flat = bucket.buffer()
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, flat)
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(total / len(parts))
    return future


@app.function(num_instances=2, workers_per_node=2, volumes={CKPT: VOLUME})
def train(run: str, epochs: int = 8, seed: int = 0, epoch_pause_s: float = 0.0
          ) -> dict[str, Any]:
    """Train a small regression MLP with DDP; resume from the run's latest checkpoint."""
    import time

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from flow_sdk.volumes import load_checkpoint, save_checkpoint

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = torch.Generator().manual_seed(1234)  # the same data on every rank and every run
    x = torch.randn(2048, 16, generator=data)
    y = x @ torch.randn(16, 1, generator=data) + 0.05 * torch.randn(2048, 1, generator=data)
    x, y = x[rank::world], y[rank::world]

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    directory = f"{CKPT}/{run}"
    state = load_checkpoint(directory)  # every rank reads the same latest checkpoint
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["epoch"] + 1
        if rank == 0:
            print(f"resuming from the checkpoint of epoch {state['epoch']}", flush=True)
    ddp = DDP(model)
    # Through a lambda: DDP checks a hook's annotations, which are strings in this module.
    ddp.register_comm_hook(None, lambda state, bucket: ordered_allreduce(state, bucket))
    for epoch in range(start, epochs):
        # The batch order depends on (seed, epoch) only, so a resumed run replays it exactly.
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        total = torch.zeros(2)
        for begin in range(0, len(x), 32):
            idx = order[begin:begin + 32]
            loss = nn.functional.mse_loss(ddp(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += torch.tensor([float(loss) * len(idx), len(idx)])
        dist.all_reduce(total)
        save_checkpoint({"epoch": epoch, "model": model.state_dict(), "optim": opt.state_dict()},
                        directory, step=epoch)
        if rank == 0:
            print(f"epoch {epoch}: loss={float(total[0] / total[1]):.5f}, checkpoint saved",
                  flush=True)
        time.sleep(epoch_pause_s)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    dist.destroy_process_group()
    return {"resumed_from": start, "weights": weights.tolist(), "world_size": world}


def kill_after_checkpoint(run: str, epochs: int, kill_after: int, timeout_s: float = 300.0
                          ) -> int:
    """Start ``run`` and cancel it once the checkpoint of epoch ``kill_after`` is on the
    volume; returns the last checkpointed epoch at the kill."""
    folder = VOLUME.local_path / run
    task = train.spawn(run, epochs, epoch_pause_s=0.5)
    deadline = time.monotonic() + timeout_s
    while True:
        latest = latest_checkpoint(folder)
        if latest is not None and checkpoint_step(latest) >= kill_after:
            break
        if task.status.is_terminal:
            raise SystemExit(f"the first run ended ({task.status}) before it could be killed")
        if time.monotonic() > deadline:
            task.cancel()
            raise SystemExit(f"no checkpoint of epoch {kill_after} after {timeout_s:.0f}s")
        time.sleep(0.05)
    task.cancel()  # every worker and agent of the run is killed now
    if task.status is not TaskStatus.CANCELLED:
        raise SystemExit(f"the first run is {task.status}, not CANCELLED")
    latest = latest_checkpoint(folder)
    assert latest is not None
    return checkpoint_step(latest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--kill-after", type=int, default=2)
    args = parser.parse_args(argv)
    if not 0 <= args.kill_after < args.epochs - 1:
        parser.error("--kill-after must leave at least one epoch to resume")
    run = f"run-{secrets.token_hex(3)}"
    VOLUME.create()
    killed_at = kill_after_checkpoint(run, args.epochs, args.kill_after)
    print(f"{run}: killed after the checkpoint of epoch {killed_at}", flush=True)
    resumed = train.remote(run, args.epochs)
    print(f"{run}: resumed at epoch {resumed['resumed_from']} and finished", flush=True)
    reference = train.remote(f"{run}-reference", args.epochs)
    diff = max(abs(a - b) for a, b in zip(resumed["weights"], reference["weights"]))
    same = resumed["weights"] == reference["weights"]
    print(f"max |resumed - uninterrupted| = {diff:.3g} over {len(resumed['weights'])} weights",
          flush=True)
    print(json.dumps({"run": run, "killed_at_epoch": killed_at,
                      "resumed_from": resumed["resumed_from"], "max_abs_diff": diff,
                      "identical": same}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
