"""The ``local`` provider: every node is a node-agent process on this machine.

Each node gets its own instance id, working directory and loopback address (127.x.y.z), and
its own slice of this machine's GPUs where there are any. Nodes run the same agent,
rendezvous and worker code as cloud nodes; only how they are started and found differs.
Node agents start in a session of their own, so they outlive the caller (caps keep holding
when the caller dies) and a terminate reaches every process they started.

Beside each agent runs a small *keeper* process (``_sshd.py``): it time-stamps the agent's
stdout and stderr into the node's ``boot.<instance id>`` log stream and runs the node's own
OpenSSH server on the node's address, with a host key made for that node at launch and pinned
in the instance record. When the agent exits, the keeper stops sshd and whatever the node left
running. Without an ``sshd`` on this machine nodes run without SSH, and ``ssh_endpoint`` says
how to install it.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from flow_sdk import protocol, signing
from flow_sdk._config import flow_home
from flow_sdk.errors import FieldProblem, ProviderError
from flow_sdk.protocol import Outcome, TaskStatus
from flow_sdk.providers import _local_gpus, _sshd, process
from flow_sdk.providers._local_volumes import LocalProviderVolumes
from flow_sdk.providers.base import (
    GcReport,
    Instance,
    LaunchRequest,
    LogRecord,
    LogStore,
    ObjectStore,
    Provider,
    SshEndpoint,
    Volumes,
    boot_stream,
)
from flow_sdk.providers.files import FileLogStore, FileObjectStore, private_dirs
from flow_sdk.spec import TaskSpec

KEEPER_EXIT_WAIT_S = 3.0  # after the agent stops, how long its keeper may take to drain and exit

_children: dict[int, subprocess.Popen[bytes]] = {}  # agents this process started, to reap


def _reap() -> None:
    for pid, proc in list(_children.items()):
        if proc.poll() is not None:
            del _children[pid]




class LocalLogStore(FileLogStore):
    """The file log store, plus where a stream's file lives (the keeper appends to it).

    Writers on this machine append each line right after stamping it: a follow need hold
    lines back only for a thread that is descheduled in between."""

    write_delay_s: ClassVar[float] = 0.1

    def stream_path(self, task_id: str, stream: str) -> Path:
        return self._path(task_id, stream)


@dataclass(frozen=True)
class _TaskSsh:
    """What every node of a task needs to run its OpenSSH server."""

    sshd: str
    keygen: str
    key_path: Path  # the client's private key (0600); the public key is beside it
    public_key: str
    user: str


class LocalProvider(Provider):
    name: ClassVar[str] = "local"
    shares_client_filesystem: ClassVar[bool] = True

    def __init__(self, root: Path | None = None, *, ssh: bool = True,
                 sshd: str | None = None) -> None:
        """``ssh=False`` starts nodes without an OpenSSH server; ``sshd`` names the sshd
        binary (default: found on PATH or in the usual places)."""
        self.root = Path(root) if root is not None else flow_home() / "local"
        self.ssh = ssh
        self.sshd = sshd
        self._store = FileObjectStore(self.root / "store")
        self._logs = LocalLogStore(self.root / "logs")
        self._sshd_ok: set[str] = set()  # sshd binaries that accepted a node config here
        self._volumes = LocalProviderVolumes(self, self.root)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LocalProvider:
        unknown = sorted(set(config) - {"root", "ssh", "sshd"})
        if unknown:
            raise ProviderError(f"provider_config has unknown key(s) {unknown} for the local "
                                "provider; known keys: root, ssh, sshd")
        root = config.get("root")
        return cls(Path(root) if root else None, ssh=bool(config.get("ssh", True)),
                   sshd=config.get("sshd") or None)

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"root": str(self.root)}
        if not self.ssh:
            config["ssh"] = False
        if self.sshd:
            config["sshd"] = self.sshd
        return config

    @property
    def store(self) -> ObjectStore:
        return self._store

    @property
    def logs(self) -> LogStore:
        return self._logs

    @property
    def volumes(self) -> Volumes:
        return self._volumes

    def check(self, spec: TaskSpec) -> list[FieldProblem]:
        problems = []
        if spec.gpu is not None:
            problem = _local_gpus.machine_problem(spec.gpu.count, spec.gpu.model,
                                                  spec.num_instances)
            if problem is not None:
                problems.append(FieldProblem("gpu", problem))
        return problems

    def rendezvous_ports(self) -> tuple[int, int]:
        # Every local node shares this machine's port space: take free ports per task.
        return process.free_port(), process.free_port()

    # -- nodes ------------------------------------------------------------------------------

    def _records_dir(self, task_id: str) -> Path:
        return self.root / "instances" / task_id

    def _node_dir(self, task_id: str, instance_id: str) -> Path:
        return self.root / "nodes" / task_id / instance_id

    def _ssh_dir(self, task_id: str, instance_id: str | None = None) -> Path:
        folder = self.root / "ssh" / task_id
        return folder / instance_id if instance_id else folder

    def launch(self, request: LaunchRequest) -> list[Instance]:
        block = f"127.{secrets.randbelow(254) + 1}.{secrets.randbelow(254) + 1}"
        private_dirs(self.root)  # 0700: payloads, results and logs are this user's alone
        records = self._records_dir(request.task_id)
        private_dirs(records)
        (records / "address-block").write_text(block)
        self._reserve_gpus(request)
        return self._start_nodes(request, range(request.spec.num_instances), rollback_all=True)

    # -- GPUs: disjoint slices per node, never shared between running tasks -------------------

    def _gpu_registry(self) -> _local_gpus.GpuRegistry:
        return _local_gpus.GpuRegistry(self.root / "gpus")

    def _reserve_gpus(self, request: LaunchRequest) -> None:
        """Reserve the task's per-node GPU slices (waiting while other tasks hold them)."""
        gpu, task_id = request.spec.gpu, request.task_id
        slices: list[tuple[int, ...]] = []
        if gpu is not None:
            def on_wait(message: str) -> None:  # what task.logs(source="boot") shows
                writer = self._logs.writer(task_id, boot_stream("local-gpus"))
                writer.write([LogRecord(time.time(), message)])
                writer.close()
            slices = self._gpu_registry().reserve_here(
                task_id, gpu.count, gpu.model, request.spec.num_instances, self._holds_gpus,
                request.spec.availability_timeout_s, on_wait)
        (self._records_dir(task_id) / "gpu-slices.json").write_text(json.dumps(slices))

    def _holds_gpus(self, task_id: str) -> bool:
        """A task keeps its GPUs while a node of it runs."""
        return bool(self.live_pids(task_id))

    def _node_gpus(self, task_id: str, index: int) -> str:
        """The node's ``CUDA_VISIBLE_DEVICES``: its slice (a replacement takes over the slice
        of the node it replaces), or empty for a node that asked for no GPU."""
        path = self._records_dir(task_id) / "gpu-slices.json"
        slices = json.loads(path.read_text()) if path.exists() else []
        return _local_gpus.visible_devices(slices[index % len(slices)] if slices else ())

    def add_instances(self, request: LaunchRequest, count: int) -> list[Instance]:
        first = len(self._records(request.task_id))
        return self._start_nodes(request, range(first, first + count), rollback_all=False)

    def _task_ssh(self, task_id: str) -> _TaskSsh | str:
        """The task's SSH settings (its client key made on first use), or why nodes of this
        task run without SSH."""
        if not self.ssh:
            return "SSH is off for this provider (provider_config ssh=False)"
        sshd = _sshd.find_sshd(self.sshd)
        if sshd is None:
            where = f" at {self.sshd}" if self.sshd else ""
            return (f"no OpenSSH server (sshd) was found on this machine{where}; "
                    f"{_sshd.install_hint()}")
        keygen = _sshd.find_keygen(sshd)
        if keygen is None:
            return ("no ssh-keygen was found to make the node's host key; install the OpenSSH "
                    "client (`sudo apt-get install openssh-client`) and launch again")
        folder = self._ssh_dir(task_id)
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        key_path = folder / "client_ed25519"
        if key_path.exists():
            kind, data = Path(f"{key_path}.pub").read_text().split()[:2]
            public_key = f"{kind} {data}"
        else:
            public_key = _sshd.generate_keys(keygen, [key_path], f"flow-client-{task_id}")[0]
        return _TaskSsh(sshd, keygen, key_path, public_key, pwd.getpwuid(os.getuid()).pw_name)

    def _start_nodes(self, request: LaunchRequest, indexes: range,
                     rollback_all: bool) -> list[Instance]:
        """Start one agent (and its keeper) per index; address and GPU slice follow the index."""
        block = (self._records_dir(request.task_id) / "address-block").read_text()
        package_root = str(Path(__file__).resolve().parents[2])
        instance_ids = [f"i-{secrets.token_hex(8)}0" for _ in indexes]
        started: list[Instance] = []
        try:
            servers = self._prepare_ssh(request.task_id, instance_ids,
                                        [f"{block}.{index + 1}" for index in indexes])
            for index, instance_id, server in zip(indexes, instance_ids, servers):
                started.append(self._start_node(request, index, instance_id,
                                                f"{block}.{index + 1}", package_root,
                                                server))
        except OSError as exc:
            if rollback_all:
                self.terminate(request.task_id)
            else:
                self.terminate_instances(request.task_id, [i.instance_id for i in started])
            raise ProviderError(f"could not start local node {len(started) + 1} of "
                                f"{len(indexes)}: {exc}; what had started was stopped") from exc
        return sorted(started, key=lambda i: i.instance_id)

    def _prepare_ssh(self, task_id: str, instance_ids: Sequence[str],
                     addresses: Sequence[str]) -> list[tuple[_sshd.NodeSsh, _TaskSsh, str] | str]:
        """Per node: its sshd files, the task's SSH settings and the pinned host key; or why
        it runs without SSH. Host keys are made side by side."""
        settings = self._task_ssh(task_id)
        if isinstance(settings, str):
            return [settings] * len(instance_ids)
        nodes = []
        for instance_id, address in zip(instance_ids, addresses):
            folder = self._ssh_dir(task_id, instance_id)
            folder.mkdir(parents=True)
            os.chmod(folder, 0o700)
            nodes.append(_sshd.NodeSsh(folder, address, process.free_port(address), settings.user))
        host_keys = _sshd.generate_keys(settings.keygen, [n.host_key for n in nodes],
                                        f"flow-node-{task_id}")
        return [(node, settings, key) for node, key in zip(nodes, host_keys)]

    def _start_node(self, request: LaunchRequest, index: int, instance_id: str, address: str,
                    package_root: str,
                    server: tuple[_sshd.NodeSsh, _TaskSsh, str] | str) -> Instance:
        task_id = request.task_id
        workdir = self._node_dir(task_id, instance_id)
        private_dirs(workdir.parent)
        workdir.mkdir(mode=0o700)
        env = dict(os.environ)
        env.update(request.boot_env)
        protocol.boot_env_to_file(env, workdir / "boot.json")  # it holds the task's secret
        env[_sshd.INSTANCE_ENV] = instance_id
        env["FLOW_NODE_ADDRESS"] = address
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env["CUDA_VISIBLE_DEVICES"] = self._node_gpus(task_id, index)
        # Workers share this machine's cores with every other local node of the task.
        env["FLOW_NODE_CORES"] = str(max(1, len(os.sched_getaffinity(0))
                                         // request.spec.num_instances))
        record: dict[str, Any] = {"instance_id": instance_id, "task_id": task_id,
                                  "address": address, "workdir": str(workdir),
                                  "terminated": False}
        sshd_argv: list[str] = []
        if isinstance(server, str):
            record["ssh_unavailable"] = server
        else:
            node, settings, host_key = server
            node.write(client_public_key=settings.public_key, python=sys.executable, session={
                "workdir": str(workdir), "env": env, "task_id": task_id,
                "instance_id": instance_id,
                "nodes_dir": str(self._store.root / protocol.nodes_prefix(task_id)),
                "task_file": str(self._store.root / protocol.task_key(task_id))})
            problem = None
            if settings.sshd not in self._sshd_ok:  # every node's config has the same shape
                problem = _sshd.check_config(settings.sshd, node.config)
            if problem is None:
                self._sshd_ok.add(settings.sshd)
                sshd_argv = node.sshd_argv(settings.sshd)
                record["ssh"] = {"host": address, "port": node.port, "user": settings.user,
                                 "host_key": host_key, "key_path": str(settings.key_path)}
            else:
                record["ssh_unavailable"] = f"sshd rejected the node's configuration: {problem}"
        stream = self._logs.stream_path(task_id, boot_stream(instance_id))
        private_dirs(stream.parent)
        read_end, write_end = os.pipe()
        try:
            keeper = subprocess.Popen(
                [sys.executable, "-I", "-S", _sshd.__file__, "keep", str(stream), instance_id,
                 "--", *sshd_argv], cwd=workdir, env=env, stdin=read_end,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            _children[keeper.pid] = keeper
            record.update(keeper_pid=keeper.pid, keeper_ticks=process.start_ticks(keeper.pid))
            proc = subprocess.Popen(
                [sys.executable, "-m", "flow_sdk.agent"], cwd=workdir, env=env,
                stdin=subprocess.DEVNULL, stdout=write_end, stderr=write_end,
                start_new_session=True)
        finally:
            os.close(read_end)
            os.close(write_end)
        _children[proc.pid] = proc
        launched_at = time.time()
        record.update(pid=proc.pid, ticks=process.start_ticks(proc.pid), launched_at=launched_at)
        (self._records_dir(task_id) / f"{instance_id}.json").write_text(json.dumps(record))
        return Instance(instance_id, task_id, address, "running", launched_at,
                        ssh=_endpoint(record))

    def _records(self, task_id: str) -> list[dict[str, Any]]:
        folder = self._records_dir(task_id)
        if not folder.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(folder.glob("i-*.json"))]

    def list_instances(self, task_id: str) -> list[Instance]:
        """Every node of the task; a node is running until its agent and its keeper have
        exited (so its boot output is complete once it reads as terminated)."""
        _reap()
        instances = []
        for rec in self._records(task_id):
            alive = not rec["terminated"] and (process.is_alive(rec["pid"], rec["ticks"])
                                               or _keeper_alive(rec))
            instances.append(Instance(rec["instance_id"], task_id, rec["address"],
                                      "running" if alive else "terminated", rec["launched_at"],
                                      ssh=_endpoint(rec)))
        return sorted(instances, key=lambda i: i.instance_id)

    def ssh_endpoint(self, task_id: str, instance_id: str) -> SshEndpoint:
        rec = self._record(task_id, instance_id)
        if rec["terminated"] or not process.is_alive(rec["pid"], rec["ticks"]):
            raise ProviderError(f"node {instance_id} of task {task_id} has stopped, and its SSH "
                                "server with it; its logs remain (task.logs(), `flow logs`)")
        endpoint = _endpoint(rec)
        if endpoint is None:
            raise ProviderError(f"node {instance_id} of task {task_id} runs without SSH: "
                                f"{rec.get('ssh_unavailable', 'it was launched without SSH')}")
        return endpoint

    def terminate(self, task_id: str) -> None:
        self._stop(task_id, self._records(task_id))
        if all(rec["terminated"] for rec in self._records(task_id)):
            shutil.rmtree(self._ssh_dir(task_id), ignore_errors=True)  # the client key too
            self._gpu_registry().release(task_id)

    def terminate_instances(self, task_id: str, instance_ids: list[str]) -> None:
        self._stop(task_id, [r for r in self._records(task_id) if r["instance_id"] in instance_ids])

    def _stop(self, task_id: str, records: list[dict[str, Any]]) -> None:
        """Stop agents and workers, let each keeper write the last boot output and stop its
        sshd, then stop whatever still carries the nodes' instance ids (SSH sessions,
        processes workers left behind) and remove the nodes' directories."""
        for rec in records:
            if process.is_alive(rec["pid"], rec["ticks"]):
                process.kill_group(rec["pid"], reap=_reap)
            for pgid in _worker_pgids(Path(rec["workdir"])):
                process.kill_group(pgid, reap=_reap)
        deadline = time.monotonic() + KEEPER_EXIT_WAIT_S
        for rec in records:
            while _keeper_alive(rec) and time.monotonic() < deadline:
                _reap()
                time.sleep(0.02)
            if _keeper_alive(rec):
                process.kill_group(rec["keeper_pid"], reap=_reap)
        _sshd.stop_node_processes([rec["instance_id"] for rec in records])
        for rec in records:
            rec["terminated"] = True
            (self._records_dir(task_id) / f"{rec['instance_id']}.json").write_text(json.dumps(rec))
            shutil.rmtree(rec["workdir"], ignore_errors=True)
            shutil.rmtree(self._ssh_dir(task_id, rec["instance_id"]), ignore_errors=True)
        _reap()

    def node_pids(self, task_id: str) -> list[int]:
        """Every live process of the task's nodes: agents, workers, keepers, sshd, SSH
        sessions and what they started (Linux; agents and keepers elsewhere)."""
        records = self._records(task_id)
        pids = set(_sshd.pids_with_env(_sshd.INSTANCE_ENV, [r["instance_id"] for r in records]))
        pids.update(r["pid"] for r in records if process.is_alive(r["pid"], r["ticks"]))
        pids.update(r["keeper_pid"] for r in records if _keeper_alive(r))
        return sorted(pids)

    def live_pids(self, task_id: str) -> list[int]:
        """Agent pids of the task that are still running (for tests and ``flow gc``)."""
        return [rec["pid"] for rec in self._records(task_id)
                if process.is_alive(rec["pid"], rec["ticks"])]

    # -- gc ---------------------------------------------------------------------------------

    def gc(self, *, dry_run: bool = False) -> GcReport:
        """Stop what is left of tasks that ended (an outcome is written, or every agent
        exited) or that no client on this machine knows any more (their client record is
        gone: such a task is recorded CANCELLED). Live tasks are kept."""
        report = GcReport(self.name, dry_run)
        folder = self.root / "instances"
        tasks = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        clients = flow_home(create=False) / "tasks"  # where the client keeps its task records
        for task_id in tasks:
            records = self._records(task_id)
            if not records or all(r["terminated"] for r in records) and \
                    not self.node_pids(task_id):
                continue
            outcome = self._store.get(protocol.outcome_key(task_id))
            agents_alive = any(process.is_alive(r["pid"], r["ticks"]) for r in records)
            if outcome is not None:
                why = f"task ended {Outcome.from_json(outcome).status}"
            elif not (clients / f"{task_id}.json").exists():
                why = "no client record on this machine (the task is recorded CANCELLED)"
            elif not agents_alive:
                why = "every node agent has exited"
            else:
                report.live_tasks.append(task_id)
                continue
            report.reasons[task_id] = why
            report.stopped_processes.extend(self.node_pids(task_id))
            if dry_run:
                continue
            if outcome is None and not (clients / f"{task_id}.json").exists() \
                    and signing.has_task_secret(task_id):  # signed: the client checks it
                signing.SignedStore(self._store, signing.load_task_secret(task_id)) \
                    .put_record_if_absent(protocol.outcome_key(task_id), Outcome(
                        TaskStatus.CANCELLED.value, "stopped by `flow gc`: no client on this "
                        "machine knows the task", time.time()))
            self.terminate(task_id)
        return report

    def _record(self, task_id: str, instance_id: str) -> dict[str, Any]:
        path = self._records_dir(task_id) / f"{instance_id}.json"
        if not path.exists():
            raise ProviderError(f"task {task_id} has no local instance {instance_id}")
        data: dict[str, Any] = json.loads(path.read_text())
        return data


def _endpoint(record: Mapping[str, Any]) -> SshEndpoint | None:
    ssh = record.get("ssh")
    return SshEndpoint(**ssh) if ssh else None


def _keeper_alive(record: Mapping[str, Any]) -> bool:
    return "keeper_pid" in record and process.is_alive(record["keeper_pid"],
                                                        record["keeper_ticks"])


def _worker_pgids(workdir: Path) -> list[int]:
    pids_file = workdir / protocol.WORKER_PGIDS_FILE
    return [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
