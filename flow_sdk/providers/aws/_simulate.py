"""The simulated cloud: moto's fake instances are played by local node-agent processes.

The provider launches through the real boto3 paths (over HTTP to a moto server); then, for
every instance moto reports, this module starts what a real node's bootstrap starts
(``python -m flow_sdk.providers.aws._bootlog``: the agent, its output shipped to the node's
boot log stream) in a session of its own, with the environment that bootstrap gives it:
``FLOW_BOOT`` taken from the user-data moto recorded, the moto instance id, and its private
address mapped onto loopback.
AWS credentials come from this process's environment (moto's fake ones), never from
``FLOW_BOOT`` or the user-data.

``SimulatedNodes`` is the aws provider's node runtime for this (``_runtime.NodeRuntime``; built
by ``AwsConfig.node_runtime`` when provider_config has ``simulate``): the provider never asks
which runtime it holds. Replacement nodes (``add_instances``, called by a node agent under
``max_restarts``) are started the same way, from that agent's process; ``terminate_instances``
stops the named nodes' processes by pid. Simulated nodes run no bootstrap (so no volumes, S3
mounts or sshd) and have no metadata service unless provider_config ``imds_endpoint`` names
one.
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

from flow_sdk import protocol
from flow_sdk.errors import FieldProblem, ProviderError
from flow_sdk.providers import process
from flow_sdk.providers.aws import _userdata
from flow_sdk.spec import TaskSpec

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


class SimulatedNodes:
    """The simulated cloud's node runtime: start, list and stop the local processes that play
    a task's instances."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def check(self, spec: TaskSpec) -> list[FieldProblem]:
        """Volumes and S3 mounts need the node bootstrap, which simulated nodes do not run."""
        return [FieldProblem(field, f"the simulated aws cloud runs no node bootstrap, so it "
                             f"cannot mount {field} (EFS, EBS and S3 mounts need real EC2 "
                             f"nodes); remove {field}, or use the local provider, which "
                             "supports them")
                for field, given in (("volumes", spec.volumes), ("mounts", spec.mounts))
                if given]

    def python(self) -> str | None:
        """Simulated nodes run this machine's interpreter."""
        return f"{sys.version_info.major}.{sys.version_info.minor}"

    def address(self, private_ip: str) -> str:
        return simulated_address(private_ip) if private_ip else private_ip

    def rendezvous_ports(self) -> tuple[int, int] | None:
        """Simulated nodes share this machine's port space: free ports per task."""
        return process.free_port(), process.free_port()

    def interruption_endpoint(self) -> str | None:
        return None

    def ssh_unavailable(self, task_id: str, instance_id: str) -> str | None:
        return (f"node {instance_id} of task {task_id} is a simulated node (a local agent "
                "process); the simulated aws cloud runs no sshd")

    def _records_dir(self, task_id: str) -> Path:
        return self.root / "instances" / task_id

    def _records(self, task_id: str) -> list[dict[str, Any]]:
        folder = self._records_dir(task_id)
        if not folder.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(folder.glob("i-*.json"))]

    def start(self, task_id: str, nodes: Sequence[tuple[str, str]], user_data: str) -> None:
        """One agent per ``(instance_id, address)``, with the ``FLOW_BOOT`` the user-data sets."""
        boot_env = {"FLOW_BOOT": _userdata.boot_json_from_user_data(user_data)}
        package_root = str(Path(__file__).resolve().parents[3])
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
                      "pid": proc.pid, "ticks": process.start_ticks(proc.pid),
                      "started_at": time.time(), "workdir": str(workdir)}
            (self._records_dir(task_id) / f"{instance_id}.json").write_text(json.dumps(record))

    def live_pids(self, task_id: str) -> list[int]:
        """Agent pids of the task that are still running."""
        _reap()
        return [r["pid"] for r in self._records(task_id)
                if process.is_alive(r["pid"], r["ticks"])]

    def stop(self, task_id: str, instance_ids: Sequence[str] | None = None) -> list[int]:
        """Stop the processes of the named nodes of the task (every node when None), agents
        and their workers, by their recorded pids; returns the agent pids that were still
        running. Idempotent."""
        wanted = None if instance_ids is None else set(instance_ids)
        stopped = [pid for rec in self._records(task_id)
                   if wanted is None or rec["instance_id"] in wanted
                   for pid in self._stop_node(rec)]
        _reap()
        return stopped

    def _stop_node(self, rec: Mapping[str, Any]) -> list[int]:
        stopped = []
        if process.is_alive(rec["pid"], rec["ticks"]):
            process.kill_group(rec["pid"], reap=_reap)
            stopped.append(int(rec["pid"]))
        workdir = Path(rec["workdir"])
        pids_file = workdir / protocol.WORKER_PGIDS_FILE
        if pids_file.exists():
            for line in pids_file.read_text().split():
                process.kill_group(int(line), reap=_reap)
        if workdir.exists():
            boot_log = workdir / "boot.log"
            if boot_log.exists():  # keep the node's raw output for post-mortems
                keep = self.root / "boot" / str(rec["task_id"])
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(boot_log, keep / f"{rec['instance_id']}.log")
            shutil.rmtree(workdir, ignore_errors=True)
        return stopped

    def node_pid(self, task_id: str, instance_id: str) -> int:
        """The pid of the process that plays the node (what the bootstrap runs)."""
        for rec in self._records(task_id):
            if rec["instance_id"] == instance_id:
                return int(rec["pid"])
        raise ProviderError(f"the simulated cloud has no node {instance_id} of task {task_id}")

    def agent_pid(self, task_id: str, instance_id: str) -> int:
        """The pid of the node's agent (the child of its bootstrap process)."""
        node = self.node_pid(task_id, instance_id)
        try:
            children = Path(f"/proc/{node}/task/{node}/children").read_text().split()
        except FileNotFoundError:
            children = []
        if not children:
            raise ProviderError(f"node {instance_id} of task {task_id} runs no agent (its "
                                f"bootstrap process {node} has no child)")
        return int(children[0])

    def tasks(self) -> list[str]:
        folder = self.root / "instances"
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def stop_all(self) -> list[int]:
        """Stop the processes of every simulated task under this root."""
        return [pid for task_id in self.tasks() for pid in self.stop(task_id)]
