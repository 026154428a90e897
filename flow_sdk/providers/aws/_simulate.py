"""The simulated cloud: moto's fake instances are played by local node-agent processes.

The provider launches through the real boto3 paths (over HTTP to a moto server); then, for
every instance moto reports, this module starts what a real node's bootstrap starts
(``python -m flow_sdk.providers.aws._bootlog``: the agent, its output shipped to the node's
boot log stream) in a session of its own, with the environment that bootstrap gives it:
``FLOW_BOOT`` taken from the user-data moto recorded, the moto instance id, and its private
address mapped onto loopback.
AWS credentials come from this process's environment (moto's fake ones), never from
``FLOW_BOOT`` or the user-data.

The real path has exactly three hooks into this module: the address mapping, free rendezvous
ports, and starting / stopping the node processes.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import flow_sdk
from flow_sdk import protocol
from flow_sdk.errors import ProviderError
from flow_sdk.providers import _process
from flow_sdk.providers.local import _free_port

_children: dict[int, subprocess.Popen[bytes]] = {}  # node processes this process started


def _reap() -> None:
    for pid, proc in list(_children.items()):
        if proc.poll() is not None:
            del _children[pid]


def simulated_address(private_ip: str) -> str:
    """A VPC private address mapped onto loopback: ``a.b.c.d`` -> ``127.b.c.d``.

    All of 127.0.0.0/8 is loopback on Linux, and addresses of one VPC differ in their last
    three octets, so the mapping keeps nodes apart and lets each bind its own address.
    """
    try:
        address = ipaddress.IPv4Address(private_ip)
    except ValueError:
        raise ProviderError(f"instance address {private_ip!r} is not an IPv4 address; the "
                            "simulated cloud maps IPv4 private addresses only") from None
    return "127." + ".".join(str(address).split(".")[1:])


def free_ports() -> tuple[int, int]:
    """Rendezvous ports for a simulated task: its nodes share this machine's port space."""
    return _free_port(), _free_port()


class SimulatedNodes:
    """Start, list and stop the local processes that play a task's instances."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _records_dir(self, task_id: str) -> Path:
        return self.root / "instances" / task_id

    def _records(self, task_id: str) -> list[dict[str, Any]]:
        folder = self._records_dir(task_id)
        if not folder.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(folder.glob("i-*.json"))]

    def start(self, task_id: str, nodes: Sequence[tuple[str, str]],
              boot_env: Mapping[str, str]) -> None:
        """One agent per ``(instance_id, address)``; ``boot_env`` is what the user-data sets."""
        package_root = str(Path(flow_sdk.__file__).resolve().parent.parent)
        self._records_dir(task_id).mkdir(parents=True, exist_ok=True)
        for instance_id, address in nodes:
            workdir = self.root / "nodes" / task_id / instance_id
            workdir.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ)
            env.update(boot_env)
            env.update({"FLOW_INSTANCE_ID": instance_id, "FLOW_NODE_ADDRESS": address,
                        "FLOW_NODE_WORKDIR": str(workdir)})
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (package_root, env.get("PYTHONPATH")) if p)
            with open(workdir / "boot.log", "ab") as boot_log:
                proc = subprocess.Popen(  # what the bootstrap runs: the agent + boot log
                    [sys.executable, "-m", "flow_sdk.providers.aws._bootlog"], cwd=workdir,
                    env=env,
                    stdin=subprocess.DEVNULL, stdout=boot_log, stderr=subprocess.STDOUT,
                    start_new_session=True)
            _children[proc.pid] = proc
            record = {"instance_id": instance_id, "task_id": task_id, "address": address,
                      "pid": proc.pid, "ticks": _process.start_ticks(proc.pid),
                      "started_at": time.time(), "workdir": str(workdir)}
            (self._records_dir(task_id) / f"{instance_id}.json").write_text(json.dumps(record))

    def live_pids(self, task_id: str) -> list[int]:
        """Agent pids of the task that are still running."""
        _reap()
        return [r["pid"] for r in self._records(task_id)
                if _process.is_alive(r["pid"], r["ticks"])]

    def stop(self, task_id: str) -> list[int]:
        """Stop every process of the task (agents and their workers); returns the agent pids
        that were still running. Idempotent."""
        stopped = []
        for rec in self._records(task_id):
            if _process.is_alive(rec["pid"], rec["ticks"]):
                _process.kill_group(rec["pid"], reap=_reap)
                stopped.append(rec["pid"])
            workdir = Path(rec["workdir"])
            pids_file = workdir / protocol.WORKER_PGIDS_FILE
            if pids_file.exists():
                for line in pids_file.read_text().split():
                    _process.kill_group(int(line), reap=_reap)
            if workdir.exists():
                boot_log = workdir / "boot.log"
                if boot_log.exists():  # keep the node's raw output for post-mortems
                    keep = self.root / "boot" / task_id
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(boot_log, keep / f"{rec['instance_id']}.log")
                shutil.rmtree(workdir, ignore_errors=True)
        _reap()
        return stopped

    def tasks(self) -> list[str]:
        folder = self.root / "instances"
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def stop_all(self) -> list[int]:
        """Stop the processes of every simulated task under this root."""
        return [pid for task_id in self.tasks() for pid in self.stop(task_id)]
