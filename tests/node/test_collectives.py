"""Collective timeouts for workers: the environment the agent adds, the default timeout set
without importing torch, and a real gloo all_reduce that a rank never joins failing on time
instead of hanging."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from flow_sdk.node.collectives import collective_env, timeout_from_env
from flow_sdk.wire import envvars

# Sets the default before torch is imported, then again once it is.
DEFAULTS_CHILD = """
import os, sys
from datetime import timedelta
from flow_sdk.node.collectives import install_default_timeout
install_default_timeout()
assert "torch" not in sys.modules, "install_default_timeout imported torch"
import torch.distributed
from torch.distributed.distributed_c10d import _get_default_timeout
assert _get_default_timeout("gloo") == timedelta(seconds=3), _get_default_timeout("gloo")
assert _get_default_timeout("nccl") == timedelta(seconds=3), _get_default_timeout("nccl")
os.environ["FLOW_COLLECTIVE_TIMEOUT_S"] = "5"
install_default_timeout()
assert _get_default_timeout("gloo") == timedelta(seconds=5), _get_default_timeout("gloo")
print("ok", flush=True)
"""

# One rank of a 2-process gloo group made without timeout=. Imports torch, says so, waits
# for a line on stdin (so both ranks join at once), then rank 0 all_reduces and reports how
# long it took to fail; rank 1 never joins the all_reduce.
RANK_CHILD = """
import sys, time
from flow_sdk.node.collectives import install_default_timeout
install_default_timeout()
import torch
import torch.distributed as dist
rank, store = int(sys.argv[1]), sys.argv[2]
print("imported", flush=True)
sys.stdin.readline()
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
if rank == 1:
    time.sleep(120)
start = time.monotonic()
try:
    dist.all_reduce(torch.ones(1))
except RuntimeError as error:
    print(f"raised {time.monotonic() - start:.2f} {error}".replace("\\n", " "), flush=True)
else:
    print("completed", flush=True)
"""


def _env(timeout_s: str) -> dict[str, str]:
    return {**os.environ, envvars.COLLECTIVE_TIMEOUT_S: timeout_s}


def test_the_agent_adds_the_timeout_and_nccl_error_handling_unless_the_user_sets_them() -> None:
    env = collective_env(30.0, {})
    assert env == {envvars.COLLECTIVE_TIMEOUT_S: "30.0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                   "TORCH_NCCL_ENABLE_MONITORING": "1", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "90"}
    user = {envvars.COLLECTIVE_TIMEOUT_S: "5", "NCCL_ASYNC_ERROR_HANDLING": "0",
            "TORCH_NCCL_ENABLE_MONITORING": "0"}
    assert collective_env(30.0, user) == {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "90"}
    with pytest.raises(ValueError):
        collective_env(0.0, {})


def test_the_timeout_is_read_from_the_environment() -> None:
    assert timeout_from_env({envvars.COLLECTIVE_TIMEOUT_S: "2.5"}) == timedelta(seconds=2.5)
    assert timeout_from_env({}) is None
    assert timeout_from_env({envvars.COLLECTIVE_TIMEOUT_S: "0"}) is None
    with pytest.raises(ValueError, match=envvars.COLLECTIVE_TIMEOUT_S):
        timeout_from_env({envvars.COLLECTIVE_TIMEOUT_S: "ten"})


def test_the_default_timeout_is_set_when_torch_distributed_is_imported_not_before() -> None:
    done = subprocess.run([sys.executable, "-c", DEFAULTS_CHILD], env=_env("3"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.slow
def test_an_all_reduce_a_rank_never_joins_fails_after_the_default_timeout(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    ranks = [subprocess.Popen([sys.executable, "-c", RANK_CHILD, str(rank), str(store)],
                              env=_env("3"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for rank in (0, 1)]
    try:
        for rank in ranks:
            assert rank.stdout is not None and rank.stdout.readline().strip() == "imported"
        for rank in ranks:
            assert rank.stdin is not None
            rank.stdin.write("go\n")
            rank.stdin.flush()
        started = time.monotonic()
        assert ranks[0].stdout is not None
        report = ranks[0].stdout.readline().strip()
        elapsed = time.monotonic() - started
        assert report.startswith("raised ") and "Timed out" in report, report
        assert 2.5 <= float(report.split()[1]) < 20, report
        assert elapsed < 20
    finally:
        for rank in ranks:
            if rank.poll() is None:
                os.kill(rank.pid, signal.SIGKILL)
            rank.wait(timeout=10)
