"""A task's own nodes fork their workers from a warm agent (torch imported once) when that
saves work: the call imports torch and a node starts several workers or may restart them.
Every other task starts its workers cold, each in a new interpreter."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from flow_sdk import FlowApp
from flow_sdk.errors import RecordError
from flow_sdk.payload import pack_parts
from flow_sdk.wire import TaskRecord
from flow_sdk.wire.records import to_json

pytestmark = pytest.mark.slow

app = FlowApp("warm-start")
COLD_WORKER = "flow_sdk.node.agent.worker"  # what a cold worker's interpreter was started with


def _sum_ranks() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return {"sum": float(value.item()), "argv": list(sys.orig_argv)}


def _no_torch() -> dict[str, Any]:
    return {"sum": 0.0, "argv": list(sys.orig_argv)}


def _started(task: Any) -> tuple[list[dict[str, Any]], list[str]]:
    results = task.results(timeout=120)
    return results, task.logs(source="agent")


def test_two_workers_that_import_torch_fork_from_their_agent(flow_home: Path) -> None:
    task = app.function(num_instances=2, workers_per_node=2, quiet=True)(_sum_ranks).spawn()
    results, agent_lines = _started(task)
    assert [r["sum"] for r in results] == [6.0] * 4
    # a forked worker is the agent's interpreter: it never ran the worker module's command
    assert all(COLD_WORKER not in " ".join(r["argv"]) for r in results), results
    warm = [line for line in agent_lines if "workers fork from the node's warm (torch" in line]
    assert len(warm) == 2, agent_lines  # one line per node


@pytest.mark.parametrize("shape", ["one-worker-no-restarts", "code-without-torch"])
def test_other_tasks_start_their_workers_cold(flow_home: Path, shape: str) -> None:
    fn, workers = (_sum_ranks, 1) if shape == "one-worker-no-restarts" else (_no_torch, 2)
    task = app.function(num_instances=1, workers_per_node=workers, quiet=True)(fn).spawn()
    results, agent_lines = _started(task)
    assert len(results) == workers
    assert all(COLD_WORKER in " ".join(r["argv"]) for r in results), results
    assert not [line for line in agent_lines if "template" in line], agent_lines


def test_the_record_says_whether_the_call_imports_torch() -> None:
    def nested() -> None:
        def inner() -> None:
            from torch import nn  # noqa: F401

    assert "torch" in pack_parts(nested, (), {}).imports
    assert "torch" in pack_parts(_sum_ranks, (), {}).imports
    assert "torch" not in pack_parts(_no_torch, (), {}).imports
    record = TaskRecord("t-1", {}, "d", 1.0, 1, 2, imports_torch=True)
    assert TaskRecord.from_json(to_json(record)).imports_torch is True
    with pytest.raises(RecordError, match="imports_torch is 'yes'"):
        TaskRecord.from_json(to_json(record).replace(b"true", b'"yes"'))
