"""GPUs on the test runner's real Slurm cluster, whose nodes declare two GPUs each (GRES
``gpu:h100:2``, backed by stand-in device files: Slurm allocates them and sets
``CUDA_VISIBLE_DEVICES`` as it does on a GPU cluster; nothing here opens them).
``gpu="h100:2"`` becomes ``--gpus-per-node=h100:2``: each node's two workers (one per GPU)
see the node's two devices and take theirs by ``LOCAL_RANK``, as torchrun's do; a GPU type
the partition lacks, or more GPUs than a node has, is refused before anything is
submitted."""

from __future__ import annotations

import os

import pytest

from flow_sdk import FlowApp
from flow_sdk.errors import ValidationError
from slurm_cluster import GPU_TYPE, SlurmCluster

pytestmark = pytest.mark.slow


def devices() -> dict[str, str]:
    return {key: os.environ.get(key, "") for key in
            ("RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURMD_NODENAME")}


def test_gpus_per_node_are_slurms_and_each_worker_takes_its_own(
        app: FlowApp, slurm_clean: SlurmCluster) -> None:
    seen = app.function(num_instances=2, gpu=f"{GPU_TYPE}:2", max_run_time_hours=0.1)(
        devices).spawn().results(timeout=120)
    assert [(s["RANK"], s["LOCAL_RANK"]) for s in seen] == [
        ("0", "0"), ("1", "1"), ("2", "0"), ("3", "1")]
    assert {s["CUDA_VISIBLE_DEVICES"] for s in seen} == {"0,1"}  # the node's two, from Slurm
    assert {s["SLURM_JOB_GPUS"] for s in seen} == {"0,1"}
    assert len({s["SLURMD_NODENAME"] for s in seen}) == 2


def test_a_gpu_type_or_count_no_node_has_is_refused_before_submitting(
        app: FlowApp, slurm_clean: SlurmCluster) -> None:
    with pytest.raises(ValidationError, match="has GPUs of type h100, not a100"):
        app.function(num_instances=1, gpu="a100:1", max_run_time_hours=0.1)(devices)
    with pytest.raises(ValidationError, match="no node of the default partition has 8 GPUs "
                                              "of type h100: 2 at most"):
        app.function(num_instances=1, gpu="h100:8", max_run_time_hours=0.1)(devices)
    assert slurm_clean.jobs_left(within_s=1) == ""
