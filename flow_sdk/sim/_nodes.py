"""The simulated cloud's node runtime: moto's instances become nodes on this machine that run
the real boot.

The aws provider launches through the real boto3 paths (over HTTP to a moto server); then, for
every instance EC2 reported, ``SimulatedNodes.start`` starts one simulated instance
(``_instance``): an IMDSv2 emulator on loopback, and the rendered user-data, unmodified, run by
bash as root in the instance's own mount namespace (``_root``). So the node fetches the
caller's SDK wheel from the store with the AWS CLI, checks its SHA-256, installs it offline
into ``/opt/flow/venv``, mounts its EFS volumes, arms the runtime cap's ``shutdown`` timer,
ships its boot log, and starts the agent, exactly as on EC2. The instance's private address is
mapped onto loopback, and its AWS calls go to the simulated cloud's endpoint
(``AWS_ENDPOINT_URL``) with the credentials of its instance profile's role, which its
metadata service hands out as EC2's does; the instance processes themselves (which play EC2)
hold the simulated account's keys, never ones from the task or the caller.

``SimulatedNodes`` is handed to the aws provider as its node runtime
(``flow_sdk.providers.aws.NodeRuntime``) by ``AwsSimProvider``: it gets each gang's typed boot
(``NodeBoot``: launch region, mount paths, volumes) with the user-data it runs. Replacement
nodes (``add_instances``, called by a node agent under ``max_restarts``) are started the same
way, from that agent's process (the node's provider config carries these settings under
``sim``); ``terminate_instances`` stops the named instances. It owns what it starts: the
instance processes (recorded under ``<root>/instances``), their mounts and loop devices.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flow_sdk.errors import ProviderError
from flow_sdk.system import procs
from flow_sdk.providers.aws import NodeBoot
from flow_sdk.sim._access import read_keys
from flow_sdk.sim._instance import SHIMS, detach_devices, instance_pids
from flow_sdk.sim._instancespec import InstanceSpec
from flow_sdk.sim._settings import NODE_KEY, NodeSettings
from flow_sdk.wire import envvars

# The keys of an AWS API that checks none (provider_config endpoint_url): never the caller's
# own, which need not exist.
DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
_NOT_INHERITED = {envvars.SIM_INSTANCE, "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE",
                  "AWS_EC2_METADATA_SERVICE_ENDPOINT"}

_children: dict[int, subprocess.Popen[bytes]] = {}  # instance processes this process started
_STOP_GRACE_S = 10.0  # an instance stops its own processes (SIGTERM, SIGKILL after 2 s)


def _reap() -> None:
    for pid, proc in list(_children.items()):
        if proc.poll() is not None:
            del _children[pid]


def _write_record(path: Path, record: dict[str, Any]) -> None:
    """Replace the instance record whole, so a reader never sees half of one."""
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps(record))
    os.replace(temp, path)


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
    """The simulated cloud's node runtime: start, list and stop the simulated instances that
    play a task's EC2 instances."""

    def __init__(self, settings: NodeSettings, endpoint_url: str | None) -> None:
        self.settings = settings
        self.root = Path(settings.root)
        self.endpoint_url = endpoint_url

    def address(self, private_ip: str) -> str:
        return simulated_address(private_ip) if private_ip else private_ip

    def node_config(self) -> dict[str, Any]:
        """A node's provider config carries these settings, so a node's own provider (it
        rebuilds ``aws-sim``) starts replacements in the same simulated cloud."""
        return {NODE_KEY: self.settings.to_dict()}

    def records(self, task_id: str) -> list[dict[str, Any]]:
        """The task's simulated instances: id, address, process (pid and start ticks), tag
        (``FLOW_SIM_INSTANCE`` of its processes) and node directory."""
        folder = self._records_dir(task_id)
        if not folder.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(folder.glob("i-*.json"))]

    def _records_dir(self, task_id: str) -> Path:
        return self.root / "instances" / task_id

    def _shims(self) -> Path:
        """The shims, copied under the root with their modes set (an installed package need
        not keep the executable bit)."""
        target = self.root / "shims"
        target.mkdir(parents=True, exist_ok=True)
        for shim in sorted(SHIMS.iterdir()):
            copy = target / shim.name
            shutil.copyfile(shim, copy)
            copy.chmod(0o755)
        return target

    def _environment(self) -> dict[str, str]:
        """The instance processes' environment: this one's, the simulated account's keys
        instead of any of the caller's (or a node's), and this package importable."""
        package_root = str(Path(__file__).resolve().parents[2])
        env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
        keys = self.settings.keys_file
        env.update(read_keys(Path(keys)).environment() if keys else DUMMY_CREDENTIALS)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        return env

    def start(self, boot: NodeBoot, nodes: Sequence[tuple[str, str]]) -> None:
        """One simulated instance per ``(instance_id, address)``, booting ``boot.user_data``."""
        if not self.endpoint_url:
            raise ProviderError("the simulated aws cloud needs provider_config endpoint_url")
        task_id = boot.task_id
        shims = self._shims()
        env = self._environment()
        self._records_dir(task_id).mkdir(parents=True, exist_ok=True)
        delays = self.settings.boot_delay_s
        block = any(v.interface == "block" for v in boot.spec.volumes.values())
        for index, (instance_id, address) in enumerate(nodes):
            node_dir = self.root / "nodes" / task_id / instance_id
            node_dir.mkdir(parents=True, exist_ok=True)
            node_dir.chmod(0o700)  # the user-data carries the task's secret
            (node_dir / "user-data").write_text(boot.user_data)
            (node_dir / "user-data").chmod(0o600)
            spec = InstanceSpec(
                instance_id=instance_id, task_id=task_id, address=address, region=boot.region,
                endpoint_url=self.endpoint_url, node_dir=str(node_dir),
                efs_root=str(self.root / "efs"), ebs_root=str(self.root / "ebs"),
                envs_root=self.settings.envs or str(self.root / "envs"),
                block_devices=block, shims=str(shims), mount_paths=boot.inputs.mount_paths,
                minute_s=self.settings.minute_s,
                boot_delay_s=delays[index] if index < len(delays) else 0.0,
                wheelhouse=self.settings.wheelhouse, python=self.settings.python)
            self._launch(spec, node_dir, env)

    def _launch(self, spec: InstanceSpec, node_dir: Path, env: dict[str, str]) -> None:
        """Record the instance, then start its process. The record comes first and names the
        instance's tag, which every one of its processes carries (the instance process
        too): a launcher killed between the two leaves nothing that ``stop`` cannot find."""
        spec.save(node_dir / "instance.json")
        record: dict[str, Any] = {"instance_id": spec.instance_id, "task_id": spec.task_id,
                                  "address": spec.address, "pid": None, "ticks": None,
                                  "started_at": time.time(), "node_dir": str(node_dir),
                                  "tag": spec.tag}
        path = self._records_dir(spec.task_id) / f"{spec.instance_id}.json"
        _write_record(path, record)
        with open(node_dir / "hypervisor.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "flow_sdk.sim._instance", str(node_dir / "instance.json")],
                cwd=node_dir, env={**env, envvars.SIM_INSTANCE: spec.tag}, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _children[proc.pid] = proc
        record.update(pid=proc.pid, ticks=procs.start_ticks(proc.pid))
        _write_record(path, record)

    def stop(self, task_id: str, instance_ids: Sequence[str] | None = None) -> list[int]:
        """Stop the named instances of the task (every one when None): each stops its own
        processes, and whatever is left after a grace period is killed here. Returns the
        pids that were still running. Idempotent."""
        wanted = None if instance_ids is None else set(instance_ids)
        stopped = [pid for rec in self.records(task_id)
                   if wanted is None or rec["instance_id"] in wanted
                   for pid in self._stop_instance(rec)]
        _reap()
        return stopped

    def _stop_instance(self, rec: dict[str, Any]) -> list[int]:
        stopped = []
        pid, ticks = rec["pid"], rec["ticks"]
        if pid is not None and procs.is_alive(pid, ticks):
            os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
            deadline = time.monotonic() + _STOP_GRACE_S
            while procs.is_alive(pid, ticks) and time.monotonic() < deadline:
                _reap()
                time.sleep(0.05)
            if procs.is_alive(pid, ticks):
                procs.stop_pids([pid], grace_s=0)
        stopped.extend(procs.stop_pids(instance_pids(rec["tag"])))
        _reap()
        node_dir = Path(rec["node_dir"])
        detach_devices(node_dir)
        if node_dir.exists():
            keep = self.root / "boot" / str(rec["task_id"])  # for post-mortems
            keep.mkdir(parents=True, exist_ok=True)
            for name, source in (("console", node_dir / "console.log"),
                                 ("boot", node_dir / "state" / "boot.log"),
                                 ("instance", node_dir / "instance.log")):
                if source.exists():
                    try:
                        shutil.copy(source, keep / f"{rec['instance_id']}.{name}.log")
                    except OSError as exc:  # a post-mortem copy never stops a teardown
                        warnings.warn(f"the simulated cloud could not keep {source} for "
                                      f"post-mortems: {exc}", stacklevel=2)
            shutil.rmtree(node_dir, ignore_errors=True)
        return stopped

    def tasks(self) -> list[str]:
        folder = self.root / "instances"
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def stop_all(self) -> list[int]:
        """Stop every simulated instance under this root (``stop_account``)."""
        return [pid for task_id in self.tasks() for pid in self.stop(task_id)]
