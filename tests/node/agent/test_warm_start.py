"""A task's own nodes fork their workers from a fork server (torch imported once) when that
saves work: the call imports torch and a node starts several workers or may restart them.
Every other task starts its workers cold, each in a new interpreter."""

from __future__ import annotations

import ast
import subprocess
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
SERVER = "flow_sdk.node.agent.forkserver"


def _sum_ranks() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return _whoami(float(value.item()))


def _no_torch() -> dict[str, Any]:
    return _whoami(0.0)


def _whoami(total: float) -> dict[str, Any]:
    """The worker's start: its interpreter's command, its parent and whether the agent's code
    (which holds the task's secret) was ever loaded in it."""
    import os

    return {"sum": total, "argv": list(sys.orig_argv), "parent": os.getppid(),
            "agent_code": "flow_sdk.node.agent.main" in sys.modules,
            "parent_argv": Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")}


def _started(task: Any) -> tuple[list[dict[str, Any]], list[str]]:
    results = task.results(timeout=120)
    return results, task.logs(source="agent")


@pytest.mark.parametrize("shape", ["2x2", "1x1-with-restarts"])
def test_workers_that_import_torch_fork_from_a_server_without_the_secret(
        flow_home: Path, shape: str) -> None:
    nodes, workers, restarts = (2, 2, 0) if shape == "2x2" else (1, 1, 1)
    task = app.function(num_instances=nodes, workers_per_node=workers, max_restarts=restarts,
                        quiet=True)(_sum_ranks).spawn()
    results, agent_lines = _started(task)
    size = nodes * workers
    assert [r["sum"] for r in results] == [float(sum(range(size)))] * size
    # a forked worker is the server's interpreter, which never loaded the agent's code
    assert all(SERVER in r["argv"] and COLD_WORKER not in r["argv"] for r in results), results
    assert not any(r["agent_code"] for r in results), results
    # and its parent is its node's agent (the subreaper), which waits for it
    assert all(b"flow_sdk.node.agent" in r["parent_argv"] for r in results), results
    assert len({r["parent"] for r in results}) == nodes  # one agent per node
    warm = [line for line in agent_lines if "workers fork from the node's warm (torch" in line]
    assert len(warm) == nodes, agent_lines  # one line per node


def test_a_script_that_imports_torch_forks_its_workers(flow_home: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\n\nimport torch\n\nprint('started by', sys.orig_argv)\n")
    task = app.submit_file(script, num_instances=1, workers_per_node=2)
    assert task.wait(timeout=120).value == "SUCCEEDED", task.logs()
    assert task.record().imports_torch is True
    assert sum(SERVER in line for line in task.logs() if "started by" in line) == 2
    assert any("workers fork from the node's warm (torch" in line
               for line in task.logs(source="agent"))


def test_a_task_that_sets_a_start_up_variable_starts_cold(flow_home: Path) -> None:
    task = app.function(workers_per_node=2, environment={"OMP_PROC_BIND": "false"},
                        quiet=True)(_sum_ranks).spawn()
    results, agent_lines = _started(task)
    assert all(COLD_WORKER in r["argv"] for r in results), results
    assert any("cold start: the warm template cannot start these workers: the task sets "
               "OMP_PROC_BIND" in line for line in agent_lines), agent_lines


@pytest.mark.parametrize("shape", ["one-worker-no-restarts", "code-without-torch"])
def test_other_tasks_start_their_workers_cold(flow_home: Path, shape: str) -> None:
    fn, workers = (_sum_ranks, 1) if shape == "one-worker-no-restarts" else (_no_torch, 2)
    task = app.function(num_instances=1, workers_per_node=workers, quiet=True)(fn).spawn()
    results, agent_lines = _started(task)
    assert len(results) == workers
    assert all(COLD_WORKER in r["argv"] for r in results), results
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


_BROKEN_SERVER = """
import sys
from flow_sdk.node.agent.forkserver import ForkServer
env = dict(__import__("os").environ, PYTHONPATH=sys.argv[1])
server = ForkServer(env)
kept = []
try:
    why = server.ready(lambda: kept.append(1))
    print(repr((why, len(kept), server.problem(env), server.describe())))
finally:
    server.close()
"""


def test_a_fork_server_that_cannot_start_is_reported_and_the_node_kept_alive(
        tmp_path: Path) -> None:
    """Its torch import fails after 2.5 s: the agent is kept alive meanwhile (its heartbeat),
    and the failure is what ``problem`` then says, so the workers start cold. (In a process
    of its own: the server makes its caller a subreaper.)"""
    (tmp_path / "torch.py").write_text("import time\ntime.sleep(2.5)\n"
                                       "raise RuntimeError('a broken torch')\n")
    done = subprocess.run([sys.executable, "-c", _BROKEN_SERVER, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    why, kept, problem, described = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert why.startswith("the fork server did not start"), why
    assert kept >= 2 and problem == why and described == f"cold: {why}"
    assert "RuntimeError: a broken torch" in done.stderr  # the server's own traceback
