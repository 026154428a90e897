"""The simulated cloud: moto's instances become nodes on this machine that run the real boot.

The provider launches through the real boto3 paths (over HTTP to a moto server); then, for
every instance EC2 reported, ``SimulatedNodes.start`` starts one simulated instance
(``_siminstance``): an IMDSv2 emulator on loopback, and the rendered user-data, unmodified,
run by bash as root in the instance's own mount namespace (``_simroot``). So the node fetches
the caller's SDK wheel from the store with the AWS CLI, checks its SHA-256, installs it
offline into ``/opt/flow/venv``, mounts its EFS volumes, arms the runtime cap's ``shutdown``
timer, ships its boot log, and starts the agent, exactly as on EC2. The instance's private
address is mapped onto loopback, and its AWS calls go to the simulated cloud's endpoint
(``AWS_ENDPOINT_URL``) with this process's AWS credentials (moto's fake ones), never ones from
the task.

``SimulatedNodes`` is the aws provider's node runtime for this (``_runtime.NodeRuntime``; built
by ``AwsConfig.node_runtime`` when provider_config has ``simulate``): the provider never asks
which runtime it holds. Replacement nodes (``add_instances``, called by a node agent under
``max_restarts``) are started the same way, from that agent's process; ``terminate_instances``
stops the named instances. Users can rehearse their own launch code and configuration with it
(README, "Rehearse a launch on this machine"); it needs Linux and root (a private mount
namespace per node, loop devices for EBS volumes), and runs no sshd.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flow_sdk.errors import FieldProblem, ProviderError
from flow_sdk.providers import process
from flow_sdk.providers.aws import _userdata
from flow_sdk.providers.aws._siminstance import (
    INSTANCE_ENV,
    SHIMS,
    InstanceSpec,
    detach_devices,
    instance_pids,
)
from flow_sdk.spec import TaskSpec

@dataclass(frozen=True)
class SimulateConfig:
    """Settings of the simulated cloud: each of moto's instances is played on this machine by
    a process that runs the node's real user-data (``_siminstance``)."""

    root: str  # node directories, process records, EFS shared directories, shims
    # How many seconds one minute of a node's ``shutdown -h +N`` lasts (the runtime cap's
    # power-off timer); 60 is real time, less rehearses the cap quickly.
    minute_s: float = 60.0
    # The i-th instance of each launch waits this long before its user-data runs (a slow image
    # pull or network), to rehearse the boot clock against the availability clock.
    boot_delay_s: tuple[float, ...] = ()
    # Wheels pip may install on the nodes (no package index is ever reached); None: only what
    # the image (this machine's Python) already has.
    wheelhouse: str | None = None
    # The simulated image's python3 (the nodes' interpreter, and its bin directory on their
    # PATH for the AWS CLI): the interpreter of the process that first read this config.
    python: str = sys.executable
    # Where the image keeps the SDK environments, by wheel digest (``/opt/flow/envs`` on every
    # instance); None: ``<root>/envs``. Simulated clouds that share it boot a wheel one of them
    # has seen without installing it again, as an image that carries it would.
    envs: str | None = None


def parse_simulate(value: Any) -> SimulateConfig:
    """``provider_config.simulate``, checked."""
    if not isinstance(value, Mapping) or not isinstance(value.get("root"), str):
        raise ProviderError("provider_config.simulate must be a mapping with 'root' (a "
                            "directory for the simulated nodes), e.g. {'root': '/tmp/flow-sim'}")
    known = ("root", "minute_s", "boot_delay_s", "wheelhouse", "python", "envs")
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ProviderError(f"provider_config.simulate has unknown keys {unknown}; known: "
                            f"{', '.join(known)}")
    minute_s = value.get("minute_s", 60.0)
    if isinstance(minute_s, bool) or not isinstance(minute_s, (int, float)) or minute_s <= 0:
        raise ProviderError(f"provider_config.simulate.minute_s {minute_s!r} must be a positive "
                            "number of seconds (60 is real time)")
    delays = value.get("boot_delay_s", ())
    if not isinstance(delays, (list, tuple)) or not all(
            isinstance(d, (int, float)) and not isinstance(d, bool) and d >= 0 for d in delays):
        raise ProviderError(f"provider_config.simulate.boot_delay_s {delays!r} must be a list "
                            "of seconds >= 0, one per instance of a launch, e.g. [0, 60]")
    wheelhouse = value.get("wheelhouse")
    if wheelhouse is not None and (not isinstance(wheelhouse, str) or not wheelhouse):
        raise ProviderError(f"provider_config.simulate.wheelhouse {wheelhouse!r} must be a "
                            "directory of wheels")
    python = value.get("python") or sys.executable
    if not isinstance(python, str) or not os.path.isabs(python):
        raise ProviderError(f"provider_config.simulate.python {python!r} must be the absolute "
                            "path of a python3 interpreter")
    envs = value.get("envs")
    if envs is not None and (not isinstance(envs, str) or not os.path.isabs(envs)):
        raise ProviderError(f"provider_config.simulate.envs {envs!r} must be the absolute path "
                            "of a directory")
    return SimulateConfig(root=value["root"], minute_s=float(minute_s),
                          boot_delay_s=tuple(float(d) for d in delays), wheelhouse=wheelhouse,
                          python=python, envs=envs)


# The simulated account's credentials, for the instances' AWS CLI and boto3 (moto takes any):
# never the caller's own, which need not exist.
SIMULATED_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
_NOT_INHERITED = {INSTANCE_ENV, "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE"}

_children: dict[int, subprocess.Popen[bytes]] = {}  # instance processes this process started
_STOP_GRACE_S = 10.0  # an instance stops its own processes (SIGTERM, SIGKILL after 2 s)


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


def launch_region(user_data: str) -> str:
    """The region the user-data's nodes were launched in (their boot config says)."""
    config = json.loads(_userdata.boot_json_from_user_data(user_data))["provider_config"]
    launch = config.get("launch") or {}
    return str(launch.get("region") or config["region"])


class SimulatedNodes:
    """The simulated cloud's node runtime: start, list and stop the simulated instances that
    play a task's EC2 instances."""

    def __init__(self, settings: SimulateConfig, endpoint_url: str | None) -> None:
        self.settings = settings
        self.root = Path(settings.root)
        self.endpoint_url = endpoint_url

    def check(self, spec: TaskSpec) -> list[FieldProblem]:
        """What the simulated cloud cannot do: anything without Linux, root and an AWS
        endpoint."""
        problems: list[FieldProblem] = []
        if not sys.platform.startswith("linux") or os.geteuid() != 0:
            problems.append(FieldProblem("provider_config.simulate", "the simulated aws cloud "
                                         "runs each node's boot script as root in a mount "
                                         "namespace of its own: run it as root on Linux (a CI "
                                         "container, for instance)"))
        if not self.endpoint_url:
            problems.append(FieldProblem("provider_config.endpoint_url", "the simulated aws "
                                         "cloud needs the endpoint of its AWS API (a moto "
                                         "server), e.g. 'http://127.0.0.1:5000'"))
        return problems

    def python(self) -> str | None:
        """The ``major.minor`` of the simulated image's interpreter (``simulate.python``)."""
        try:
            answer = subprocess.run(
                [self.settings.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True, text=True, timeout=60, check=True)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ProviderError(f"provider_config.simulate.python {self.settings.python!r} "
                                f"does not run ({exc}); name a python3 interpreter") from exc
        return answer.stdout.strip()

    def address(self, private_ip: str) -> str:
        return simulated_address(private_ip) if private_ip else private_ip

    def rendezvous_ports(self) -> tuple[int, int] | None:
        """Simulated nodes share this machine's port space: free ports per task."""
        return process.free_port(), process.free_port()

    def interruption_endpoint(self) -> str | None:
        return None

    def ssh_unavailable(self, task_id: str, instance_id: str) -> str | None:
        return (f"node {instance_id} of task {task_id} is a simulated instance; the simulated "
                "aws cloud runs no sshd")

    def _records_dir(self, task_id: str) -> Path:
        return self.root / "instances" / task_id

    def _records(self, task_id: str) -> list[dict[str, Any]]:
        folder = self._records_dir(task_id)
        if not folder.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(folder.glob("i-*.json"))]

    def _record(self, task_id: str, instance_id: str) -> dict[str, Any]:
        for rec in self._records(task_id):
            if rec["instance_id"] == instance_id:
                return rec
        raise ProviderError(f"the simulated cloud has no node {instance_id} of task {task_id}")

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

    def start(self, task_id: str, nodes: Sequence[tuple[str, str]], user_data: str) -> None:
        """One simulated instance per ``(instance_id, address)``, booting ``user_data``."""
        if not self.endpoint_url:
            raise ProviderError("the simulated aws cloud needs provider_config endpoint_url")
        region = launch_region(user_data)
        mount_paths = _userdata.mount_paths_from_user_data(user_data)
        shims = self._shims()
        package_root = str(Path(__file__).resolve().parents[3])
        env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
        env.update(SIMULATED_CREDENTIALS)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self._records_dir(task_id).mkdir(parents=True, exist_ok=True)
        delays = self.settings.boot_delay_s
        for index, (instance_id, address) in enumerate(nodes):
            node_dir = self.root / "nodes" / task_id / instance_id
            node_dir.mkdir(parents=True, exist_ok=True)
            node_dir.chmod(0o700)  # the user-data carries the task's secret
            (node_dir / "user-data").write_text(user_data)
            (node_dir / "user-data").chmod(0o600)
            spec = InstanceSpec(
                instance_id=instance_id, task_id=task_id, address=address, region=region,
                endpoint_url=self.endpoint_url, node_dir=str(node_dir),
                efs_root=str(self.root / "efs"), ebs_root=str(self.root / "ebs"),
                envs_root=self.settings.envs or str(self.root / "envs"),
                block_devices="flow_mount_ebs " in user_data, shims=str(shims),
                mount_paths=mount_paths,
                minute_s=self.settings.minute_s,
                boot_delay_s=delays[index] if index < len(delays) else 0.0,
                wheelhouse=self.settings.wheelhouse, python=self.settings.python)
            spec.save(node_dir / "instance.json")
            with open(node_dir / "hypervisor.log", "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "flow_sdk.providers.aws._siminstance",
                     str(node_dir / "instance.json")],
                    cwd=node_dir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True)
            _children[proc.pid] = proc
            record = {"instance_id": instance_id, "task_id": task_id, "address": address,
                      "pid": proc.pid, "ticks": process.start_ticks(proc.pid),
                      "started_at": time.time(), "node_dir": str(node_dir), "tag": spec.tag}
            (self._records_dir(task_id) / f"{instance_id}.json").write_text(json.dumps(record))

    def live_pids(self, task_id: str) -> list[int]:
        """The task's instance processes, and every process of its instances, still running."""
        _reap()
        pids = []
        for rec in self._records(task_id):
            if process.is_alive(rec["pid"], rec["ticks"]):
                pids.append(int(rec["pid"]))
            pids.extend(instance_pids(rec["tag"]))
        return sorted(set(pids))

    def stop(self, task_id: str, instance_ids: Sequence[str] | None = None) -> list[int]:
        """Stop the named instances of the task (every one when None): each stops its own
        processes, and whatever is left after a grace period is killed here. Returns the
        pids that were still running. Idempotent."""
        wanted = None if instance_ids is None else set(instance_ids)
        stopped = [pid for rec in self._records(task_id)
                   if wanted is None or rec["instance_id"] in wanted
                   for pid in self._stop_instance(rec)]
        _reap()
        return stopped

    def _stop_instance(self, rec: dict[str, Any]) -> list[int]:
        stopped = []
        pid, ticks = int(rec["pid"]), rec["ticks"]
        if process.is_alive(pid, ticks):
            os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
            deadline = time.monotonic() + _STOP_GRACE_S
            while process.is_alive(pid, ticks) and time.monotonic() < deadline:
                _reap()
                time.sleep(0.05)
            if process.is_alive(pid, ticks):
                process.stop_pids([pid], grace_s=0)
        stopped.extend(process.stop_pids(instance_pids(rec["tag"])))
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
                    shutil.copy(source, keep / f"{rec['instance_id']}.{name}.log")
            shutil.rmtree(node_dir, ignore_errors=True)
        return stopped

    def node_pid(self, task_id: str, instance_id: str) -> int:
        """The pid of the process that plays the instance."""
        return int(self._record(task_id, instance_id)["pid"])

    def agent_pid(self, task_id: str, instance_id: str) -> int:
        """The pid of the node's agent (``python -m flow_sdk.agent`` on the instance)."""
        for pid in instance_pids(self._record(task_id, instance_id)["tag"]):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if b"flow_sdk.agent" in argv:
                return pid
        raise ProviderError(f"node {instance_id} of task {task_id} runs no agent (yet)")

    def tasks(self) -> list[str]:
        folder = self.root / "instances"
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def stop_all(self) -> list[int]:
        """Stop every simulated instance under this root."""
        return [pid for task_id in self.tasks() for pid in self.stop(task_id)]
