"""Every variable torchrun gives a worker, compared with what our agent gives the worker of the
same rank in the same layout (2 nodes x 2 workers, max_restarts 1), against a real torchrun
(static rendezvous, two node processes on 127.0.0.1). Only the documented differences may
differ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flow_sdk import FlowApp
from flow_sdk.system.procs import free_port
from flow_sdk.node.rendezvous.env import TORCHRUN_DIFFERENCES

pytestmark = pytest.mark.slow

DUMP = """
import json, os, sys
base = set(json.loads(os.environ["FLOW_TEST_BASE_KEYS"]))
added = {k: v for k, v in os.environ.items() if k not in base}
with open(os.path.join(sys.argv[1], f"env-{os.environ['RANK']}.json"), "w") as fh:
    json.dump(added, fh)
"""

# torchrun sets these, we do not (see TORCHRUN_DIFFERENCES).
TORCHRUN_ONLY = {"TORCHELASTIC_SIGNALS_TO_HANDLE"}
# Both set these; the values differ for the reasons TORCHRUN_DIFFERENCES gives.
VALUE_DIFFERS = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS"}
# We set these, torchrun does not.
OURS_ONLY = {"NODE_RANK"}

app = FlowApp("torchrun-env")


@app.function(num_instances=2, workers_per_node=2, max_restarts=1)
def worker_environment(keys: list[str]) -> dict[str, str]:
    import os
    return {k: os.environ[k] for k in keys if k in os.environ}


def _torchrun_envs(tmp_path: Path) -> dict[int, dict[str, str]]:
    script = tmp_path / "dump_env.py"
    script.write_text(DUMP)
    out = tmp_path / "torchrun-env"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["TMPDIR"] = str(tmp_path)  # torchrun leaves its torchelastic_* log folders there
    env["FLOW_TEST_BASE_KEYS"] = json.dumps([*env, "FLOW_TEST_BASE_KEYS"])
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
         "--node-rank", str(node), "--rdzv-backend", "static", "--master-addr", "127.0.0.1",
         "--master-port", str(port), "--max-restarts", "1", str(script), str(out)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for node in (0, 1)]
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()[-2000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {rank: json.loads((out / f"env-{rank}.json").read_text()) for rank in range(4)}


def test_documented_differences_are_exactly_the_lists_here() -> None:
    assert set(TORCHRUN_DIFFERENCES) == TORCHRUN_ONLY | VALUE_DIFFERS | OURS_ONLY


def test_worker_env_equals_torchrun_for_the_same_layout(tmp_path: Path) -> None:
    theirs = _torchrun_envs(tmp_path)
    keys = sorted(set().union(*theirs.values()) | OURS_ONLY)
    task = worker_environment.spawn(keys)
    ours = task.results(timeout=180)
    addresses = {n.node: n.address for n in task.nodes()}
    for rank in range(4):
        mine = ours[rank]
        assert mine["RANK"] == str(rank)
        for key, value in theirs[rank].items():
            if key in TORCHRUN_ONLY:
                assert key not in mine, key
            elif key in VALUE_DIFFERS:
                assert mine.get(key), f"rank {rank}: {key} is missing"
            else:
                assert mine.get(key) == value, f"rank {rank}: {key}: ours {mine.get(key)!r}, " \
                                               f"torchrun {value!r}"
        assert mine["MASTER_ADDR"] == addresses[0]
        assert mine["TORCHELASTIC_RUN_ID"] == task.task_id
        assert mine["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert mine["NODE_RANK"] == str(rank // 2)
    assert VALUE_DIFFERS | TORCHRUN_ONLY <= set().union(*theirs.values())
