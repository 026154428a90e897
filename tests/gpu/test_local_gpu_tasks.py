"""GPU tasks on the local provider of a GPU machine: slices, NCCL, isolation between tasks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flow_sdk import FlowApp, TaskStatus
from flow_sdk.catalog.gpus import GPU_MODELS
from flow_sdk.errors import ProviderError, ValidationError
from flow_sdk.providers.local._gpus import model_matches
from flow_testing import warning_lines

ROOT = Path(__file__).resolve().parents[2]
GPUS = torch.cuda.device_count()
NODES = 2 if GPUS >= 2 else 1
PER_NODE = max(1, GPUS // NODES)

app = FlowApp("gpu-tests", provider_config={"ssh": False})


def what_i_see() -> dict:
    import torch

    seen = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK",
                                           "WORLD_SIZE", "LOCAL_WORLD_SIZE", "FLOW_NODE_RANK",
                                           "OMP_NUM_THREADS")}
    seen["cuda"] = torch.cuda.is_available()
    seen["count"] = torch.cuda.device_count()
    seen["uuids"] = [str(torch.cuda.get_device_properties(i).uuid)
                     for i in range(torch.cuda.device_count())]
    return seen


def allreduce() -> dict:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    value = torch.tensor([float(dist.get_rank() + 1)], device=device)
    dist.all_reduce(value)
    result = {"sum": float(value.item()), "backend": dist.get_backend(),
              "uuid": str(torch.cuda.get_device_properties(device).uuid)}
    dist.destroy_process_group()
    return result


def hold(seconds: float) -> str:
    import time

    import torch

    torch.cuda.init()
    time.sleep(seconds)
    return os.environ["CUDA_VISIBLE_DEVICES"]


def test_env_contract_and_disjoint_slices_per_node() -> None:
    task = app.function(gpu=f"any:{PER_NODE}", num_instances=NODES)(what_i_see).spawn()
    results = task.results(timeout=300)
    assert task.status is TaskStatus.SUCCEEDED and len(results) == NODES * PER_NODE
    by_node: dict[str, set[str]] = {}
    for rank, seen in enumerate(results):
        assert seen["RANK"] == str(rank) and seen["WORLD_SIZE"] == str(NODES * PER_NODE)
        assert seen["LOCAL_WORLD_SIZE"] == str(PER_NODE)
        assert seen["cuda"] and seen["count"] == PER_NODE
        assert len(seen["CUDA_VISIBLE_DEVICES"].split(",")) == PER_NODE
        by_node.setdefault(seen["FLOW_NODE_RANK"], set()).update(seen["uuids"])
    assert len(by_node) == NODES
    all_uuids = [u for uuids in by_node.values() for u in uuids]
    assert len(all_uuids) == len(set(all_uuids)) == NODES * PER_NODE  # no GPU on two nodes


def test_nccl_allreduce_across_every_gpu() -> None:
    results = app.function(gpu=f"any:{PER_NODE}", num_instances=NODES)(allreduce).spawn() \
        .results(timeout=300)
    world = NODES * PER_NODE
    assert [r["sum"] for r in results] == [world * (world + 1) / 2] * world
    assert {r["backend"] for r in results} == {"nccl"}
    assert len({r["uuid"] for r in results}) == world  # one GPU per rank


def test_cpu_task_on_a_gpu_machine_sees_no_gpu() -> None:
    results = app.function(num_instances=2, workers_per_node=2)(what_i_see).spawn() \
        .results(timeout=300)
    assert [(r["CUDA_VISIBLE_DEVICES"], r["cuda"], r["count"]) for r in results] == \
        [("", False, 0)] * 4


def test_model_mismatch_names_the_machines_gpus() -> None:
    name = torch.cuda.get_device_name(0)
    other = next(m.name for m in GPU_MODELS if not model_matches(m.name, name))
    with pytest.raises(ValidationError, match=re.escape(name)):
        app.function(gpu=f"{other}:1")(what_i_see).spawn()


def test_two_concurrent_gpu_tasks_never_share_a_gpu() -> None:
    holder = app.function(gpu=f"any:{GPUS}")(hold).spawn(60.0)
    try:
        late = app.function(gpu="any:1", availability_timeout_s=2.0)(what_i_see)
        with pytest.raises(ProviderError, match=f"held by task {holder.task_id}"):
            late.spawn()
    finally:
        holder.cancel()
    if GPUS >= 2:
        first = app.function(gpu=f"any:{GPUS // 2}")(hold).spawn(20.0)
        second = app.function(gpu=f"any:{GPUS // 2}")(what_i_see).spawn()
        try:
            seen = second.result(timeout=300)
            held = set(first.result(timeout=300).split(","))
            assert held.isdisjoint(seen["CUDA_VISIBLE_DEVICES"].split(","))
        finally:
            first.cancel()


def test_readme_example_runs_on_nccl_without_warnings() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "examples/ddp_local.py"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "(NCCL)" in output
    assert not warning_lines(output), output[-3000:]
