"""A hung rank on a real gloo DDP gang (2 nodes x 2 workers): rank 1 sleeps inside its training
loop while the others wait for it in DDP's all-reduce. Under ``stall_timeout="auto"`` the stall
is found and named before the peers' collectives time out; when they do, the task fails with
rank 1 as its root cause, labelled as a stall, with its stack, and the timed-out ranks as its
consequences. With ``on_stall="warn"`` and the runtime cap, the TIMED_OUT error names rank 1."""

from __future__ import annotations

import inspect
import re
import subprocess
import time
from pathlib import Path

import pytest

from flow_sdk import FlowApp, TaskFailedError, TaskTimedOutError
from flow_sdk.client.stacks import task_stalls

pytestmark = pytest.mark.slow

app = FlowApp("hangs")
GANG = {"num_instances": 2, "workers_per_node": 2, "quiet": True}
HANG_STEP = 3
# Startup (importing torch, 4 ranks) takes 10-20 s on a loaded machine; the gang's ranks reach
# ``init_process_group`` well inside the collective timeout, and the 5 s stall warning comes
# well before the runtime cap.
COLLECTIVE_S = 30
CAP_S = 60


def _ddp_rank_1_sleeps(hang_step: int) -> None:
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(10**6):
        loss = ddp(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # the others wait here for rank 1's gradients
        opt.step()
        print(f"rank {rank} step {step}", flush=True)
        if rank == 1 and step == hang_step:
            time.sleep(3600)  # hangs here


def _sleep_line() -> int:
    lines, first = inspect.getsourcelines(_ddp_rank_1_sleeps)
    return first + next(i for i, line in enumerate(lines) if "time.sleep(3600)" in line)


def _shows_the_sleep(text: str) -> bool:
    """Whether ``text`` holds a frame at this file's ``time.sleep`` line."""
    return re.search(rf"{Path(__file__).name}\D{{1,12}}{_sleep_line()}\b", text) is not None


def test_a_rank_that_sleeps_is_named_before_the_collective_timeout_and_is_the_root_cause(
        ) -> None:
    hangs = app.function(**GANG, collective_timeout=f"{COLLECTIVE_S}s")(_ddp_rank_1_sleeps)
    started = time.monotonic()
    task = hangs.spawn(HANG_STEP)
    with pytest.raises(TaskFailedError) as raised:
        task.result(timeout=240)
    print(f"a rank sleeping under stall_timeout='auto', collective_timeout='{COLLECTIVE_S}s': "
          f"the task failed {time.monotonic() - started:.1f}s after spawn")
    error = raised.value
    text = str(error)
    assert error.rank == 1 and error.label == "user", text
    assert "stall: rank 1 made no progress since" in text, text
    assert "stands apart: rank 1 in _ddp_rank_1_sleeps" in text, text
    stall_s = COLLECTIVE_S // 2  # "auto": half the collective timeout
    assert f"(stall_timeout {stall_s}s)" in text, text
    peers = {int(m) for line in error.consequences for m in re.findall(r"rank (\d+)", line)}
    assert {0, 2, 3} <= peers and 1 not in peers, error.consequences
    stalls = task_stalls(task)  # a slow start (importing torch) may have been one too
    print("\n".join(s.message for s in stalls))
    # each node's watchdog records its own quiet ranks; rank 1's node says since when it was
    # quiet (the other node may record after it)
    stall = next(s for s in reversed(stalls) if "1" in s.extra.get("since", {}))
    assert stall.odd_ranks == [1] and stall.timeout_s == stall_s and stall.action == "warn"
    since = stall.extra["since"]["1"]
    first_timeout = min(float(m) for line in error.consequences
                        for m in re.findall(r"\(\+(\d+\.\d+)s\)$", line))
    assert stall.at - since < first_timeout, "the stall was named before any collective timeout"
    shown = subprocess.run(["flow", "status", task.task_id], capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode != 0
    outcome_row = next(ln for ln in shown.stdout.splitlines() if ln.startswith("outcome"))
    assert "stall: rank 1 made no progress" in outcome_row, shown.stdout
    then = [ln for ln in shown.stdout.splitlines() if ln.startswith("then")]
    assert {f"rank {r}" for r in (0, 2, 3)} <= {m for ln in then
                                               for m in re.findall(r"rank \d+", ln)}, then
    assert _shows_the_sleep(text), f"no frame at the sleep's line {_sleep_line()}:\n{text}"


def test_a_warned_stall_is_named_by_the_runtime_cap_s_error() -> None:
    hangs = app.function(**GANG, stall_timeout="5s", on_stall="warn",
                         max_run_time_hours=CAP_S / 3600)(_ddp_rank_1_sleeps)
    task = hangs.spawn(HANG_STEP)
    with pytest.raises(TaskTimedOutError) as raised:
        task.result(timeout=240)
    text = str(raised.value)
    warned = [s.at - task.record().created_at for s in task_stalls(task)]
    print(f"stall warnings {', '.join(f'{at:.1f}' for at in warned)} s after launch; "
          f"the cap {CAP_S} s")
    assert "max_run_time_hours" in text, text
    assert "stall: rank 1 made no progress since" in text, text
    assert "stands apart: rank 1 in _ddp_rank_1_sleeps" in text, text
    outcome = task.outcome()
    assert outcome is not None and outcome.rank == 1 and outcome.node == 0
    # the other nodes' caps are not its consequences; a peer's connection closed by the cap
    # may be, and never names the stalled rank
    assert not any("max_run_time_hours" in line or "node 0 rank 1" in line
                   for line in outcome.consequences), \
        outcome.consequences
    assert _shows_the_sleep(text), f"no frame at the sleep's line {_sleep_line()}:\n{text}"
