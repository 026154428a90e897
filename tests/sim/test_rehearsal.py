"""The one-step rehearsal: a 2-node task on ``provider="aws-sim"`` from a clean environment
(no AWS settings, no credentials, HOME and FLOW_HOME in a temporary directory), then ``flow
gc --dry-run``, ``flow volumes list`` and ``flow list`` against the simulated account it left,
all exit 0; its server is then stopped by its pid and nothing of it is left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from flow_testing import wait_until

from flow_sdk.procs import is_alive
from flow_sdk.sim import INSTANCE_ENV
from flow_sdk.sim._server import read_state

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import os
    from flow_sdk import FlowApp

    app = FlowApp("rehearsal")

    @app.function(provider="aws-sim", num_instances=2)
    def whoami(n: int) -> dict:
        rank = int(os.environ["RANK"])
        return {"rank": rank, "world": int(os.environ["WORLD_SIZE"]), "value": n * 10 + rank}

    task = whoami.spawn(4)
    print("TASK", task.task_id)
    print("RESULTS", task.results(timeout=300))
""")


def _clean_env(tmp: Path) -> dict[str, str]:
    """No AWS_* variable, no credentials file reachable, HOME and FLOW_HOME under ``tmp``."""
    bin_dir = str(Path(sys.executable).parent)
    return {"PATH": os.pathsep.join([bin_dir, "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": str(tmp), "FLOW_HOME": str(tmp / "flow"), "LANG": "C.UTF-8"}


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _tagged_pids(task_id: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if any(item.startswith(f"{INSTANCE_ENV}={task_id}/".encode()) for item in environ):
            found.append(int(proc.name))
    return found


def _mounts_under(root: Path) -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4] for line in lines if line.split()[4].startswith(str(root))]


def test_rehearse_two_nodes_then_gc_volumes_and_list_with_no_credentials(tmp_path: Path) -> None:
    env = _clean_env(tmp_path)
    home = tmp_path / "flow" / "aws-sim"
    (tmp_path / "rehearse.py").write_text(SCRIPT)
    try:
        out = _run([sys.executable, "rehearse.py"], env, tmp_path)
        task_id = out.split("TASK ", 1)[1].split()[0]
        assert ("RESULTS [{'rank': 0, 'world': 2, 'value': 40}, "
                "{'rank': 1, 'world': 2, 'value': 41}]") in out
        flow = str(Path(sys.executable).parent / "flow")
        gc = _run([flow, "gc", "--dry-run", "--provider", "aws-sim"], env, tmp_path)
        assert "aws-sim: would reclaim: 0 instance(s), 0 other resource(s)" in gc
        assert "aws-sim: the simulated account holds nothing" in gc
        volumes = _run([flow, "volumes", "list", "--provider", "aws-sim"], env, tmp_path)
        assert volumes.splitlines()[0].split() == ["NAME", "INTERFACE", "SIZE_GB", "IN", "USE",
                                                   "BY", "LOCATION"]
        listed = json.loads(_run([flow, "list", "--provider", "aws-sim", "--json"], env,
                                 tmp_path))
        assert [(r["task_id"], r["status"], r["nodes"]) for r in listed] == [
            (task_id, "SUCCEEDED", 2)]
        assert _tagged_pids(task_id) == []
    finally:
        state = read_state(home)
        if state is not None and state.alive():
            os.kill(state.pid, 15)  # the server, by its recorded pid
            wait_until(lambda: not state.alive(), 15, f"server {state.pid} to stop")
    assert state is not None, "the rehearsal left no record of its simulated account's server"
    assert read_state(home) is None
    assert _mounts_under(tmp_path) == []
    records = [json.loads(p.read_text()) for p in home.glob("cloud/instances/*/i-*.json")]
    assert len(records) == 2
    assert not [r for r in records if is_alive(r["pid"], r["ticks"])]
