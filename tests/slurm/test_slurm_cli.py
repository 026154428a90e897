"""``--provider slurm`` through the installed ``flow`` command on the test runner's real Slurm
cluster (``flow plan``, ``flow run``, ``flow status``, ``flow list``, ``flow ssh``), and a
task stopped at its runtime cap."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flow_sdk import FlowApp
from flow_sdk.errors import SshUnavailableError, TaskError
from flow_sdk.wire import TaskStatus
from flow_testing import run_on_terminal, wait_until
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


def waits() -> int:
    import time
    time.sleep(300)
    return 0


def test_flow_ssh_runs_a_command_in_the_job_on_the_nodes_own_folder(
        slurm_clean: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_clean.conf))
    app = FlowApp("slurm-ssh", provider="slurm",
                  provider_config={"shared_dir": str(tmp_path / "shared")})
    task = app.function(num_instances=2, max_run_time_hours=0.1)(waits).spawn()
    wait_until(lambda: task.status is TaskStatus.RUNNING, 60, "the task running")
    here = task.ssh(node=1, command="pwd; echo $SLURMD_NODENAME; exit 3", timeout=60)
    node_1 = next(n for n in task.nodes() if n.node == 1)
    assert here.exit_code == 3, here
    folder, name = here.stdout.split()
    assert folder == str(tmp_path / "shared" / "nodes" / task.task_id / node_1.instance_id)
    addresses = {node.name: node.address for node in slurm_clean.nodes}
    assert addresses[name] == node_1.address  # the node Slurm gave as node 1
    shown = subprocess.run([FLOW, "ssh", task.task_id, "--node", "0", "--command",
                            "echo $SLURM_JOB_ID"], capture_output=True, text=True, timeout=60,
                           env=slurm_clean.env, check=False)
    job = task.provider.job_state(task.task_id)  # type: ignore[attr-defined]
    assert shown.returncode == 0 and shown.stdout.split() == [job.job_id], shown.stderr
    code, typed = run_on_terminal([FLOW, "ssh", task.task_id, "--node", "1"], timeout=60,
                                  answers=[(b"", b"echo shell-on-$SLURMD_NODENAME; exit 4\n")])
    assert code == 4 and f"shell-on-{name}" in typed, typed  # a login shell on node 1
    task.cancel()
    with pytest.raises(SshUnavailableError, match="has ended"):
        task.ssh(node=0, command="true")


CALLER = """
import sys
from flow_sdk import FlowApp

app = FlowApp("slurm-gone", provider="slurm", provider_config={"shared_dir": sys.argv[1]})

@app.function(num_instances=2, max_run_time_hours=0.1)
def waits() -> None:
    import time
    print("waiting", flush=True)
    time.sleep(300)

task = waits.spawn()
print(task.task_id, flush=True)
task.wait()  # the caller is killed here
"""


def test_a_task_whose_caller_died_is_cancelled_from_the_cli_and_gc_leaves_nothing(
        slurm_clean: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    caller = subprocess.Popen([sys.executable, str(script), str(tmp_path / "shared")],
                              stdout=subprocess.PIPE, text=True, env=slurm_clean.env)
    try:
        assert caller.stdout is not None
        task_id = caller.stdout.readline().strip()
        wait_until(lambda: "RUNNING" in slurm_clean.run("squeue", "-h", "-o", "%T").stdout,
                   60, "the job running")
    finally:
        caller.kill()
        caller.wait()
    assert slurm_clean.run("squeue", "-h").stdout.strip()  # the job outlives its caller
    cancelled = _flow(slurm_clean, "cancel", task_id)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout, cancelled.stderr
    assert not slurm_clean.run("squeue", "-h").stdout.strip()
    swept = _flow(slurm_clean, "gc", "--json")  # every provider configuration used here
    assert swept.returncode == 0, swept.stderr
    [slurm] = [report for report in json.loads(swept.stdout) if report["provider"] == "slurm"]
    assert slurm["live_tasks"] == [] and slurm["terminated_instances"] == []  # nothing left
    assert not slurm_clean.run("squeue", "-h").stdout.strip()
