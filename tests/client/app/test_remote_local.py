"""End to end on the local provider: real agent processes, real TCPStore, real gloo."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flow_sdk import FlowApp, Task, TaskStatus, current

pytestmark = pytest.mark.slow

app = FlowApp("tests")

ENV_KEYS = ("FLOW_NODE_RANK", "FLOW_NUM_NODES", "FLOW_MAIN_IP", "FLOW_TASK_ID", "RANK",
            "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
            "MASTER_PORT", "USER_MARK")


@app.function(num_instances=2, workers_per_node=2, environment={"USER_MARK": "from-user"})
def env_and_allreduce() -> dict:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    dist.destroy_process_group()
    seen = {k: os.environ.get(k) for k in ENV_KEYS}
    seen.update(sum=float(value.item()), current=(current.node_index, current.num_nodes,
                                                  current.rank, current.local_rank,
                                                  current.world_size, current.is_main,
                                                  current.main_ip))
    print(f"rank {seen['RANK']} done", flush=True)
    return seen


def test_env_contract_on_every_rank_of_a_2x2_job() -> None:
    task = env_and_allreduce.spawn()
    results = task.results(timeout=120)
    assert task.status is TaskStatus.SUCCEEDED
    assert len(results) == 4
    leader = results[0]["MASTER_ADDR"]
    assert leader.startswith("127.")
    for rank, env in enumerate(results):
        node, local = divmod(rank, 2)
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(local)
        assert env["FLOW_NODE_RANK"] == env["NODE_RANK"] == str(node)
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["FLOW_NUM_NODES"] == "2" and env["FLOW_TASK_ID"] == task.task_id
        assert env["FLOW_MAIN_IP"] == env["MASTER_ADDR"] == leader
        assert int(env["MASTER_PORT"]) > 0 and env["USER_MARK"] == "from-user"
        assert env["sum"] == 10.0  # 1+2+3+4 through a real gloo all-reduce
        assert env["current"] == (node, 2, rank, local, 4, rank == 0, leader)
    # rank 0's value is what .result() returns
    assert task.result() == results[0]
    # logs: labelled per node and rank, merged in time order, filterable by node
    lines = task.logs()
    assert {ln.split(" ", 2)[0] + " " + ln.split(" ", 2)[1] for ln in lines} == {"[Node 0]", "[Node 1]"}
    assert any(ln.startswith("[Node 1] [") and "[rank 3] rank 3 done" in ln for ln in lines)
    assert all(ln.startswith("[Node 1]") for ln in task.logs(node=1))
    assert len(task.logs(tail=1)) == 1


def test_remote_returns_rank0_value_and_leaves_nothing_running(flow_home: Path) -> None:
    @app.function(num_instances=2)
    def which() -> int:
        return current.node_index * 10 + 7

    assert which.remote() == 7


class CustomError(Exception):
    pass


@app.function(num_instances=2)
def raises_on_node_1() -> None:
    import time
    if current.node_index == 1:
        raise CustomError("bad shard 17")
    time.sleep(60)


def test_remote_exception_is_reraised_with_its_type_and_remote_traceback() -> None:
    import cloudpickle
    # The release that names every file it ships by value "<dynamic-code>": the traceback
    # still names this file, the raise line's number and its source.
    version = tuple(int(p) for p in cloudpickle.__version__.split(".")[:3])
    assert version >= (3, 1, 3), f"this test pins cloudpickle>=3.1.3, not {version}"
    with pytest.raises(CustomError, match="bad shard 17") as info:
        raises_on_node_1.remote()
    cause = info.value.__cause__
    source = Path(__file__).read_text().splitlines()
    line = source.index('        raise CustomError("bad shard 17")') + 1
    assert cause is not None
    assert (f'File "{__file__}", line {line}, in raises_on_node_1\n'
            f'    raise CustomError("bad shard 17")\n') in str(cause)
    assert "<dynamic-code>" not in str(cause)
    assert any("node 1" in note for note in getattr(info.value, "__notes__", []))


def test_preflight_checks_every_pair_before_user_code() -> None:
    @app.function(num_instances=3, preflight=True)
    def ok() -> str:
        return "ran"

    task = ok.spawn()
    assert task.result(timeout=120) == "ran"
    assert any("preflight: 3 nodes, 6 node pairs" in line for line in task.logs(source="agent"))


def test_builtin_exception_type_survives() -> None:
    @app.function()
    def bad_key() -> None:
        {}["missing"]

    with pytest.raises(KeyError, match="missing"):
        bad_key.remote()


def test_manual_mode_runs_one_process_per_node_with_only_flow_vars() -> None:
    @app.function(num_instances=2, distributed_mode="manual")
    def env() -> dict:
        return {k: os.environ.get(k) for k in ("FLOW_NODE_RANK", "RANK", "MASTER_ADDR")}

    results = env.spawn().results(timeout=120)
    assert results == [{"FLOW_NODE_RANK": "0", "RANK": None, "MASTER_ADDR": None},
                       {"FLOW_NODE_RANK": "1", "RANK": None, "MASTER_ADDR": None}]


def test_main_defined_function_with_closure_and_reattach_from_another_process(
        tmp_path: Path, flow_home: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import sys
        from flow_sdk import FlowApp, current

        app = FlowApp("script")
        offset = int(sys.argv[1])

        def make(scale):
            @app.function(num_instances=2, workers_per_node=2)
            def scaled(x):
                return (x + offset) * scale + current.rank
            return scaled

        task = make(3).spawn(4)
        print(task.task_id)
    """))
    env = {**os.environ, "FLOW_HOME": str(flow_home)}
    out = subprocess.run([sys.executable, str(script), "10"], capture_output=True, text=True,
                         env=env, timeout=60, check=True)
    task_id = out.stdout.strip().splitlines()[-1]
    task = Task.from_id(task_id)  # this process never saw the function
    assert task.results(timeout=120) == [42, 43, 44, 45]
