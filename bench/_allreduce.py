"""The job both launchers run: a gloo all-reduce across every rank (also a torchrun script)."""

from __future__ import annotations


def allreduce_job() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(value)
    dist.destroy_process_group()
    return float(value.item())


if __name__ == "__main__":
    allreduce_job()
