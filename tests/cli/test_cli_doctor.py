"""`flow doctor TASK` on a running 2-node task: over real SSH, each node probes the others."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from flow_testing import node_ssh_dir, wait_until
from flow_sdk import FlowApp
from flow_sdk.providers.local import LocalProvider

pytestmark = pytest.mark.slow

app = FlowApp("doctor")


@app.function(num_instances=2)
def sleeper() -> None:
    import time
    print("ready", flush=True)
    time.sleep(300)


def _doctor(task_id: str, flow_home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["flow", "doctor", task_id, "--json", "--timeout", "2"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FLOW_HOME": str(flow_home)}, check=False)


def test_doctor_passes_then_names_the_node_that_cannot_be_reached(flow_home: Path) -> None:
    task = sleeper.spawn()
    try:
        wait_until(lambda: sum("ready" in ln for ln in task.logs()) == 2, 90, "both nodes ready")
        healthy = _doctor(task.task_id, flow_home)
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        checks = json.loads(healthy.stdout)
        assert [c["node"] for c in checks] == [0, 1] and all(not c["failures"] for c in checks)

        provider = task.provider
        assert isinstance(provider, LocalProvider)
        node1 = next(n.instance_id for n in task.nodes() if n.node == 1)
        sshd_pid = int((node_ssh_dir(provider, task.task_id, node1) / "sshd.pid").read_text())
        os.kill(sshd_pid, signal.SIGKILL)  # node 1 stops answering on its SSH port
        broken = _doctor(task.task_id, flow_home)
        assert broken.returncode == 1
        by_node = {c["node"]: c for c in json.loads(broken.stdout)}
        assert any("node 1's SSH port" in line for line in by_node[0]["failures"])
        assert by_node[1]["error"] is not None and "cannot be checked" in by_node[1]["error"]
    finally:
        task.cancel()
