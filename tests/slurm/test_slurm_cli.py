"""``--provider slurm`` through the installed ``flow`` command on the test runner's real Slurm
cluster (``flow plan``, ``flow run``, ``flow status``, ``flow list``), and a task stopped at
its runtime cap."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flow_sdk import FlowApp
from flow_sdk.errors import TaskError
from flow_sdk.wire import TaskStatus
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow
_BESIDE = Path(sys.executable).with_name("flow")
FLOW = str(_BESIDE) if _BESIDE.exists() else (shutil.which("flow") or "flow")
HELLO = """
import os
print(f"rank={os.environ['RANK']} of {os.environ['WORLD_SIZE']} on "
      f"{os.environ['SLURMD_NODENAME']}", flush=True)
"""


def _flow(cluster: SlurmCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLOW, *args], capture_output=True, text=True, timeout=180,
                          check=False, env=cluster.env, stdin=subprocess.DEVNULL)


def test_flow_plan_and_run_with_provider_slurm(slurm_clean: SlurmCluster, tmp_path: Path) -> None:
    config = json.dumps({"shared_dir": str(tmp_path / "shared")})
    target = ["--provider", "slurm", "--provider-config", config]
    planned = _flow(slurm_clean, "plan", "-N", "2", "--max-run-time-hours", "0.1", *target)
    assert planned.returncode == 0, planned.stderr
    assert "one job of 2 node(s) on the default partition (3 of 3 idle" in planned.stdout
    refused = _flow(slurm_clean, "plan", "-N", "9", *target)
    assert refused.returncode != 0 and "--num-instances: " in refused.stderr
    assert "has 3 node(s), fewer than the 9 asked" in refused.stderr

    script = tmp_path / "hello.py"
    script.write_text(textwrap.dedent(HELLO))
    ran = _flow(slurm_clean, "run", "--nodes", "2", "--max-run-time-hours",
                "0.1", *target, str(script))
    assert ran.returncode == 0, ran.stderr
    lines = sorted(line.split("] ")[-1] for line in ran.stdout.splitlines() if "rank=" in line)
    assert [line.split(" on ")[0] for line in lines] == ["rank=0 of 2", "rank=1 of 2"]
    assert len({line.split(" on ")[1] for line in lines}) == 2  # one per Slurm node
    listed = _flow(slurm_clean, "list", "--json")
    row = json.loads(listed.stdout)[0]
    assert (row["provider"], row["status"], row["nodes"]) == ("slurm", "SUCCEEDED", 2)
    shown = _flow(slurm_clean, "status", row["task_id"], "--json")
    assert json.loads(shown.stdout)["status"] == "SUCCEEDED"


def sleeps() -> None:
    import time
    time.sleep(300)


def test_a_task_past_its_runtime_cap_is_timed_out_and_its_job_ends(
        slurm_clean: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_clean.conf))
    app = FlowApp("slurm-cap", provider="slurm",
                  provider_config={"shared_dir": str(tmp_path / "shared")})
    task = app.function(num_instances=2, max_run_time_hours=0.003)(sleeps).spawn()  # 10.8 s
    assert task.wait(timeout=120) is TaskStatus.TIMED_OUT
    with pytest.raises(TaskError, match="max_run_time_hours"):
        task.result()
    assert [i.state for i in task.instances()] == ["terminated"] * 2
