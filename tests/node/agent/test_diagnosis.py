"""Diagnosis on real gloo gangs (2 nodes x 2 workers): a stalled rank is found and named from
every rank's stacks (``on_stall`` fail and warn, and ``task.stacks()`` on demand); the earliest
failure is the error, the failures it caused its notes; a worker the OOM killer ends is an
``infra`` failure; a rank frozen inside an all-reduce fails the task within the collective
timeout, named."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from flow_testing import wait_until

from flow_sdk import FlowApp, TaskFailedError
from flow_sdk.client.stacks import task_stalls
from flow_sdk.wire.stacks import StackDump, stack_dump_key

pytestmark = pytest.mark.slow

app = FlowApp("diagnosis")
GANG = {"num_instances": 2, "workers_per_node": 2, "quiet": True}


def _rank_2_sleeps(sleep_s: float, flag: str | None = None) -> int:
    import os
    import time

    import torch
    import torch.distributed as dist

    from flow_sdk import current

    dist.init_process_group("gloo")
    value = torch.ones(1)
    for step in range(3):
        dist.all_reduce(value)
        current.step(step)
    print(f"rank {dist.get_rank()} at the last all-reduce", flush=True)
    if dist.get_rank() == 2:  # in user code, while the others wait in the all-reduce
        until = time.monotonic() + sleep_s
        while time.monotonic() < until and not (flag and os.path.exists(flag)):
            time.sleep(0.1)
    dist.all_reduce(value)
    world = dist.get_world_size()
    dist.destroy_process_group()
    return world


def test_a_stalled_rank_is_named_from_four_stacks_and_fails_the_task() -> None:
    stalls = app.function(**GANG, stall_timeout="3s", on_stall="fail")(_rank_2_sleeps)
    task = stalls.spawn(120.0)
    with pytest.raises(TaskFailedError) as raised:
        task.result(timeout=120)
    assert raised.value.rank == 2 and raised.value.label == "user"
    assert "stands apart: rank 2 in _rank_2_sleeps" in str(raised.value)
    [stall] = task_stalls(task)
    assert stall.action == "fail" and stall.odd_ranks == [2] and stall.ranks
    dumps = [StackDump.from_json(raw) for rank in range(4) if (raw := task.store.get_record(
        stack_dump_key(task.task_id, stall.stacks_request, rank))) is not None]
    assert len(dumps) == 4 and all(d.text for d in dumps)
    assert [d.rank for d in dumps if d.in_collective()] == [0, 1, 3]


def test_a_stall_warns_shows_stacks_on_demand_and_the_task_goes_on(tmp_path: Path) -> None:
    warns = app.function(**GANG, stall_timeout="3s", on_stall="warn")(_rank_2_sleeps)
    flag = tmp_path / "go"  # rank 2 sleeps until the stall was warned and its stacks shown
    task = warns.spawn(120.0, str(flag))
    try:
        wait_until(lambda: sum("at the last all-reduce" in ln for ln in task.logs()) == 4, 90,
                   "every rank at the last all-reduce")
        stacks = task.stacks()
        wait_until(lambda: task_stalls(task), 60, "the stall's warning", interval=0.2)
    finally:
        flag.touch()
    assert sorted(stacks.by_rank()) == [0, 1, 2, 3] and stacks.odd_ranks == [2]
    assert "stands apart" in str(stacks)
    assert task.result(timeout=120) == 4
    [stall] = task_stalls(task)
    assert stall.action == "warn" and stall.odd_ranks == [2]
    assert any("stall: rank(s)" in ln and "stands apart: rank 2" in ln for ln in task.logs())


def _rank_3_raises() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.ones(1)
    dist.all_reduce(value)
    if dist.get_rank() == 3:
        raise ValueError("rank 3 broke first")
    dist.all_reduce(value)  # the others: the peer is gone, gloo raises a connection error


def test_the_earliest_failure_is_raised_and_the_others_are_its_consequences() -> None:
    with pytest.raises(ValueError, match="rank 3 broke first") as raised:
        app.function(**GANG)(_rank_3_raises).remote()
    notes = raised.value.__notes__
    assert any("rank 3" in n and "[user failure]" in n for n in notes), notes
    assert any(n.startswith("then, as consequences") for n in notes), notes
    assert any(n.strip().startswith("node 0 rank") for n in notes), notes


def _fills_its_cgroup(cgroup: str) -> None:
    import os

    with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
    hog = bytearray(512 * 2**20)
    print(len(hog))


def test_a_worker_the_oom_killer_ends_is_an_infra_failure() -> None:
    cgroup = Path("/sys/fs/cgroup/memory") / f"flow-oom-{uuid.uuid4().hex[:8]}"
    cgroup.mkdir()
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(128 * 2**20))
        with pytest.raises(TaskFailedError) as raised:
            app.function(quiet=True)(_fills_its_cgroup).remote(str(cgroup))
        assert raised.value.label == "infra" and raised.value.signal_name == "SIGKILL"
        assert "OOM killer" in str(raised.value)
    finally:
        wait_until(lambda: (cgroup / "cgroup.procs").read_text().strip() == "", 10,
                   "the cgroup empty")
        cgroup.rmdir()


def _all_reduce_forever() -> None:
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.ones(1)
    for step in range(10**9):
        dist.all_reduce(value)
        if step % 200 == 0:
            print(f"rank {dist.get_rank()} step {step} pid {os.getpid()}", flush=True)


def _worker_pid(task: Any, rank: int) -> int:
    """The pid that rank ``rank`` printed (a worker forked by its node's fork server has the
    server's environment in /proc, so it is found by what it says)."""
    for line in task.logs():
        if f"rank {rank} step " in line:
            return int(line.rsplit(" pid ", 1)[1])
    raise AssertionError(f"no line of rank {rank}")


def test_a_rank_frozen_in_an_all_reduce_fails_the_task_within_the_bound() -> None:
    frozen = app.function(**GANG, collective_timeout="5s", stall_timeout="off")(
        _all_reduce_forever)
    task = frozen.spawn()
    wait_until(lambda: any("rank 2 step 400" in ln for ln in task.logs()), 90, "step 400")
    os.kill(_worker_pid(task, 2), signal.SIGSTOP)  # alive, silent
    stopped = time.monotonic()
    with pytest.raises(TaskFailedError) as raised:
        task.result(timeout=120)
    elapsed = time.monotonic() - stopped
    print(f"a rank frozen in an all-reduce: the task failed {elapsed:.1f}s later")
    assert elapsed < 5 + 10  # collective_timeout plus the documented detection bound
    assert raised.value.rank == 2 and "stopped (SIGSTOP" in str(raised.value)
    assert raised.value.consequences, "the peers' timeouts are its consequences"


def _sleeps_until(flag: str) -> int:
    import os
    import time

    print("up", flush=True)
    while not os.path.exists(flag):
        time.sleep(0.1)
    return 7


def test_flow_stacks_and_flow_timeline_of_a_local_task(tmp_path: Path) -> None:
    flag = tmp_path / "go"  # the task runs until the stacks were shown, however slow
    task = app.function(num_instances=2, quiet=True)(_sleeps_until).spawn(str(flag))
    try:
        wait_until(lambda: sum(ln.endswith("up") for ln in task.logs()) == 2, 90,
                   "both ranks up")
        shown = subprocess.run(["flow", "stacks", task.task_id], capture_output=True,
                               text=True, timeout=60)
    finally:
        flag.touch()
    assert shown.returncode == 0, shown.stderr
    assert "== rank 0" in shown.stdout and "== rank 1" in shown.stdout
    assert "in _sleeps_until" in shown.stdout and "has ended" not in shown.stdout
    assert task.result(timeout=120) == 7
    drawn = subprocess.run(["flow", "timeline", task.task_id], capture_output=True, text=True,
                           timeout=60)
    assert drawn.returncode == 0, drawn.stderr
    print(drawn.stdout)
    for phase in ("agent_up", "joined", "barrier_released", "first_worker_line", "end"):
        assert phase in drawn.stdout
    nodes = task.timeline().nodes
    assert sorted(n.node for n in nodes) == [0, 1]
    assert all(n.phases["requested"] <= n.phases["agent_up"] <= n.phases["end"] for n in nodes)
