"""The ``local`` provider: every node is a node-agent process on this machine.

Each node gets its own instance id, working directory and loopback address (127.x.y.z), and
its own slice of this machine's GPUs where there are any. Nodes run the same agent,
rendezvous and worker code as cloud nodes; only how they are started and found differs.
Node agents start in a session of their own, so they outlive the caller (caps keep holding
when the caller dies) and a terminate reaches every process they started.

Beside each agent runs a small *keeper* process (``_keeper.py``): it time-stamps the agent's
stdout and stderr into the node's ``boot.<instance id>`` log stream and runs the node's own
OpenSSH server (``_sshd.py``) on the node's address, with a host key made for that node at
launch and pinned in the instance record. When the agent exits, the keeper stops sshd and
whatever the node left running. Without an ``sshd`` on this machine nodes run without SSH, and
``ssh_endpoint`` says how to install it.
"""

from __future__ import annotations

import json
import secrets
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from flow_sdk import wire
from flow_sdk.system import procs
from flow_sdk._config import flow_home
from flow_sdk.catalog import CatalogError, gpu_count_problem
from flow_sdk.errors import FieldProblem, ProviderError
from flow_sdk.providers.base import (
    Instance,
    InstanceState,
    LaunchPlan,
    LaunchRequest,
    LogRecord,
    LogStore,
    ObjectStore,
    Provider,
    SshEndpoint,
    Volumes,
    boot_stream,
)
from flow_sdk.providers.gcreport import GcReport
from flow_sdk.providers.capabilities import Capabilities, Support
from flow_sdk.providers.launch import NodeLaunch, node_launch
from flow_sdk.providers.local import _gpus, _node, _sshd
from flow_sdk.providers.files import (
    FileLogStore,
    FileObjectStore,
    private_dirs,
    replace_file,
)
from flow_sdk.providers.dirvolumes import DirectoryVolumes
from flow_sdk.spec import TaskSpec


class LocalLogStore(FileLogStore):
    """The file log store (the keeper appends to a stream's file, ``stream_path``).

    Writers on this machine append each line right after stamping it: a follow need hold
    lines back only for a thread that is descheduled in between."""

    write_delay_s: ClassVar[float] = 0.1


class LocalProvider(Provider):
    name: ClassVar[str] = "local"
    shares_client_filesystem: ClassVar[bool] = True
    capabilities: ClassVar[Capabilities] = Capabilities(
        image=Support.NOTED, price_caps=Support.HONOURED, file_volumes=Support.HONOURED,
        block_volumes=Support.HONOURED, s3_mounts=Support.HONOURED,
        interconnect=Support.NOTED, pools=Support.HONOURED,
        notes={"image": "the nodes run in this machine's Python environment, not in a "
                        "container",
               "interconnect": "the nodes of this machine talk over loopback"})

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
        self._volumes = DirectoryVolumes(self, self.root, self.root / "instances",
                                         caches=self.root / "cache" / "s3")

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
        """A GPU request this machine cannot serve, or that no machine sold has (the same
        words as every provider that uses the catalog, even where GPUs become CPU workers)."""
        if spec.gpu is None:
            return []
        try:
            unsold = gpu_count_problem(spec.gpu)
        except CatalogError as exc:
            return [FieldProblem(exc.field, str(exc))]
        problem = _gpus.machine_problem(spec.gpu.count, spec.gpu.model, spec.num_instances,
                                        unsold)
        return [] if problem is None else [FieldProblem("gpu", problem)]

    def plan(self, spec: TaskSpec) -> LaunchPlan:
        """Processes on this machine cost nothing."""
        workers = spec.slots_per_node
        return LaunchPlan(self.name, "local-process", "local", "local", 0.0, spec.num_instances,
                          spec.max_run_time_hours, workers_per_node=workers,
                          summary=f"{self.name}: {spec.num_instances} processes on this machine "
                                  f"(one agent per node), {workers} worker(s) each; costs "
                                  "nothing")

    def rendezvous_ports(self) -> tuple[int, int]:
        # Every local node shares this machine's port space: take free ports per task.
        return procs.free_port(), procs.free_port()

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

    def _gpu_registry(self) -> _gpus.GpuRegistry:
        return _gpus.GpuRegistry(self.root / "gpus")

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
        replace_file(self._records_dir(task_id) / "gpu-slices.json", json.dumps(slices))

    def _holds_gpus(self, task_id: str) -> bool:
        """A task keeps its GPUs while a node of it runs."""
        return bool(self.live_pids(task_id))

    def _node_gpus(self, task_id: str, index: int) -> str:
        """The node's ``CUDA_VISIBLE_DEVICES``: its slice (a replacement takes over the slice
        of the node it replaces), or empty for a node that asked for no GPU."""
        path = self._records_dir(task_id) / "gpu-slices.json"
        slices = json.loads(path.read_text()) if path.exists() else []
        return _gpus.visible_devices(slices[index % len(slices)] if slices else ())

    def add_instances(self, request: LaunchRequest, count: int) -> list[Instance]:
        first = len(self._records(request.task_id))
        return self._start_nodes(request, range(first, first + count), rollback_all=False)

    def _start_nodes(self, request: LaunchRequest, indexes: range,
                     rollback_all: bool) -> list[Instance]:
        """Start one agent (and its keeper) per index; address and GPU slice follow the index."""
        task_id = request.task_id
        block = (self._records_dir(task_id) / "address-block").read_text()
        instance_ids = [f"i-{secrets.token_hex(8)}0" for _ in indexes]
        addresses = [f"{block}.{index + 1}" for index in indexes]
        launch = node_launch(request)  # the caller's installed SDK: no wheels to ship
        started: list[Instance] = []
        try:
            settings = _sshd.task_ssh(self._ssh_dir(task_id), task_id, enabled=self.ssh,
                                      sshd=self.sshd)
            servers = _sshd.prepare_nodes(settings, task_id,
                                          [self._ssh_dir(task_id, i) for i in instance_ids],
                                          addresses)
            for index, instance_id, address, server in zip(indexes, instance_ids, addresses,
                                                           servers):
                started.append(self._start_node(request, launch, index, instance_id,
                                                address, server))
        except OSError as exc:
            if rollback_all:
                self.terminate(task_id)
            else:  # the nodes started, and the one that failed to
                self.terminate_instances(task_id, instance_ids[:len(started) + 1])
            raise ProviderError(f"could not start local node {len(started) + 1} of "
                                f"{len(indexes)}: {exc}; what had started was stopped") from exc
        return sorted(started, key=lambda i: i.instance_id)

    def _start_node(self, request: LaunchRequest, launch: NodeLaunch, index: int,
                    instance_id: str, address: str, server: _sshd.NodeServer | str
                    ) -> Instance:
        task_id = request.task_id
        workdir = self._node_dir(task_id, instance_id)
        private_dirs(workdir.parent)
        workdir.mkdir(mode=0o700)
        env = _node.node_env(launch, instance_id, address, workdir,
                             self._node_gpus(task_id, index), request.spec.num_instances)
        sshd_argv, ssh_fields = _sshd.configure(server, python=sys.executable,
                                                accepted=self._sshd_ok, session={
            "workdir": str(workdir), "env": _node.without_boot(env), "task_id": task_id,
            "instance_id": instance_id,
            "nodes_dir": str(self._store.root / wire.nodes_prefix(task_id)),
            "task_file": str(self._store.root / wire.task_key(task_id))})
        record: dict[str, Any] = {"instance_id": instance_id, "task_id": task_id,
                                  "address": address, "workdir": str(workdir),
                                  "terminated": False, **ssh_fields}
        stream = self._logs.stream_path(task_id, boot_stream(instance_id))
        private_dirs(stream.parent)
        # Recorded before it starts: a launcher killed mid-launch leaves a node that ``_stop``
        # finds (its processes carry its instance id) and ``flow gc`` reclaims.
        path = self._records_dir(task_id) / f"{instance_id}.json"
        replace_file(path, json.dumps({**record, **_node.launcher_fields()}))
        record.update(_node.spawn(env, workdir, stream, instance_id, sshd_argv, launch.module))
        replace_file(path, json.dumps(record))
        return _instance(record, "running")

    def _records(self, task_id: str) -> list[dict[str, Any]]:
        folder = self._records_dir(task_id)
        if not folder.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(folder.glob("i-*.json"))]

    def list_instances(self, task_id: str) -> list[Instance]:
        """Every node of the task; a node is running until its agent and its keeper have
        exited (so its boot output is complete once it reads as terminated)."""
        _node.reap()
        instances = []
        for rec in self._records(task_id):
            alive = not rec["terminated"] and (_node.agent_alive(rec) or _node.keeper_alive(rec)
                                               or _node.launching(rec))
            instances.append(_instance(rec, "running" if alive else "terminated"))
        return sorted(instances, key=lambda i: i.instance_id)

    def ssh_endpoint(self, task_id: str, instance_id: str) -> SshEndpoint:
        rec = self._record(task_id, instance_id)
        if rec["terminated"] or not _node.agent_alive(rec):
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
        """Stop the nodes (``_node.stop``) and remove their directories."""
        _node.stop(records)
        for rec in records:
            rec["terminated"] = True
            replace_file(self._records_dir(task_id) / f"{rec['instance_id']}.json",
                         json.dumps(rec))
            shutil.rmtree(rec["workdir"], ignore_errors=True)
            shutil.rmtree(self._ssh_dir(task_id, rec["instance_id"]), ignore_errors=True)

    def node_pids(self, task_id: str) -> list[int]:
        """Every live process of the task's nodes: agents, workers, keepers, sshd, SSH
        sessions and what they started (Linux; agents and keepers elsewhere)."""
        return _node.node_pids(self._records(task_id))

    def live_pids(self, task_id: str) -> list[int]:
        """Agent pids of the task that are still running (for tests and ``flow gc``)."""
        return [rec["pid"] for rec in self._records(task_id)
                if _node.agent_alive(rec)]

    # -- gc ---------------------------------------------------------------------------------

    def gc(self, *, dry_run: bool = False, ended: Mapping[str, str] | None = None
           ) -> GcReport:
        """Stop what is left of tasks that ended (every agent exited, or ``ended`` names
        them: ``flow_sdk.lifecycle`` judged them ended). Live tasks are kept."""
        report = GcReport(self.name, dry_run)
        ended = ended or {}
        folder = self.root / "instances"
        tasks = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        for task_id in tasks:
            records = self._records(task_id)
            if not records or all(r["terminated"] for r in records) and \
                    not self.node_pids(task_id):
                continue
            why = ended.get(task_id) or self._ended_why(task_id, records)
            if why is None:
                report.live_tasks.append(task_id)
                continue
            report.reasons[task_id] = why
            report.stopped_processes.extend(self.node_pids(task_id))
            if not dry_run:
                self.terminate(task_id)
        return report

    def _ended_why(self, task_id: str, records: list[dict[str, Any]]) -> str | None:
        """Why the task's leftovers may go (no agent runs), or None while it lives. The
        outcome is not read here: the store's objects are not signed for a provider, so
        ``flow_sdk.lifecycle`` judges it and names the ended tasks (``ended``)."""
        if not any(_node.agent_alive(r) for r in records):
            return "every node agent has exited"
        return None

    def _record(self, task_id: str, instance_id: str) -> dict[str, Any]:
        path = self._records_dir(task_id) / f"{instance_id}.json"
        if not path.exists():
            raise ProviderError(f"task {task_id} has no local instance {instance_id}")
        data: dict[str, Any] = json.loads(path.read_text())
        return data


def _endpoint(record: Mapping[str, Any]) -> SshEndpoint | None:
    ssh = record.get("ssh")
    return SshEndpoint(**ssh) if ssh else None


def _instance(record: Mapping[str, Any], state: InstanceState) -> Instance:
    return Instance(record["instance_id"], record["task_id"], record["address"], state,
                    record["launched_at"], ssh=_endpoint(record), market="local",
                    instance_type="local-process")
