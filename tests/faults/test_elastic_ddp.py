"""max_restarts on a real DDP job: node 1 is killed mid-training, a replacement joins, every
rank resumes from the last checkpoint, and the result equals an uninterrupted seeded run."""

from __future__ import annotations

import importlib.util
import os
import signal
import time
from pathlib import Path
from types import ModuleType

import pytest

from flow_testing import agent_pid, processes_with_env, wait_until
from flow_sdk.providers.local import LocalProvider
from flow_sdk.volumes import checkpoint_step, latest_checkpoint

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_checkpoint_resume.py"
# One worker per node (the example's own shape, 2 x 2, is run by
# tests/volumes/test_ddp_checkpoint_example.py): a lost node is a lost node however many
# ranks it held, and each gang imports torch half as often.
SHAPE = {"num_instances": 2, "workers_per_node": 1}


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ddp_checkpoint_resume", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_node_killed_mid_training_resumes_to_the_uninterrupted_result(
        flow_home: Path, fault_record) -> None:
    example = _example()
    example.VOLUME.create()
    epochs = 5
    task = example.train.with_options(max_restarts=1, **SHAPE).spawn("elastic", epochs,
                                                                      epoch_pause_s=0.5)
    folder = example.VOLUME.local_path / "elastic"

    def checkpointed() -> bool:
        latest = latest_checkpoint(folder)
        return latest is not None and checkpoint_step(latest) >= 1

    wait_until(checkpointed, 120, "the checkpoint of epoch 1")
    provider = task.provider
    assert isinstance(provider, LocalProvider)
    node1 = next(n.instance_id for n in task.nodes() if n.node == 1)
    os.kill(agent_pid(provider, task.task_id, node1), signal.SIGKILL)
    start = time.monotonic()
    resumed = task.result(timeout=240)
    elapsed = time.monotonic() - start
    reference = example.train.with_options(**SHAPE).remote("reference", epochs)
    assert resumed["resumed_from"] >= 2  # the restarted ranks loaded a checkpoint
    assert resumed["world_size"] == reference["world_size"] == 2
    assert resumed["weights"] == reference["weights"]  # same final model, so the same loss
    assert any("resuming from the checkpoint" in line for line in task.logs())
    wait_until(lambda: not processes_with_env("FLOW_HOME", str(flow_home)), 10, "no processes")
    fault_record("DDP, node 1 killed mid-training, max_restarts=1 (completes, same weights)",
                 elapsed, 0, "none")
