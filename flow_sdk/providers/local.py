"""The ``local`` provider: every node is a node-agent process on this machine.

Each node gets its own instance id, working directory and loopback address (127.x.y.z), and
its own slice of this machine's GPUs where there are any. Nodes run the same agent,
rendezvous and worker code as cloud nodes; only how they are started and found differs.
Node agents start in a session of their own, so they outlive the caller (caps keep holding
when the caller dies) and a terminate reaches every process they started.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import flow_sdk
from flow_sdk import protocol
from flow_sdk._config import flow_home
from flow_sdk.errors import FieldProblem, ProviderError
from flow_sdk.providers import _process
from flow_sdk.providers.base import Instance, LaunchRequest, LogStore, ObjectStore, Provider
from flow_sdk.providers.files import FileLogStore, FileObjectStore
from flow_sdk.spec import TaskSpec

_children: dict[int, subprocess.Popen[bytes]] = {}  # agents this process started, to reap


def _reap() -> None:
    for pid, proc in list(_children.items()):
        if proc.poll() is not None:
            del _children[pid]


def local_gpu_count() -> int:
    """GPUs on this machine per ``nvidia-smi -L`` (0 when there is no NVIDIA driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    proc = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30, check=False)
    return sum(1 for line in proc.stdout.splitlines() if line.startswith("GPU "))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalProvider(Provider):
    name: ClassVar[str] = "local"

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else flow_home() / "local"
        self._store = FileObjectStore(self.root / "store")
        self._logs = FileLogStore(self.root / "logs")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LocalProvider:
        root = config.get("root")
        return cls(Path(root) if root else None)

    def config(self) -> dict[str, Any]:
        return {"root": str(self.root)}

    @property
    def store(self) -> ObjectStore:
        return self._store

    @property
    def logs(self) -> LogStore:
        return self._logs

    def check(self, spec: TaskSpec) -> list[FieldProblem]:
        problems = []
        gpus = local_gpu_count() if spec.gpu is not None else 0
        if gpus and spec.gpu is not None and spec.gpu.count * spec.num_instances > gpus:
            problems.append(FieldProblem(
                "gpu", f"{spec.num_instances} local node(s) x {spec.gpu.count} GPU(s) need "
                f"{spec.gpu.count * spec.num_instances} GPUs but this machine has {gpus}; lower "
                "the count or num_instances, or use a cloud provider"))
        return problems

    def rendezvous_ports(self) -> tuple[int, int]:
        # Every local node shares this machine's port space: take free ports per task.
        return _free_port(), _free_port()

    # -- nodes ------------------------------------------------------------------------------

    def _records_dir(self, task_id: str) -> Path:
        return self.root / "instances" / task_id

    def _node_dir(self, task_id: str, instance_id: str) -> Path:
        return self.root / "nodes" / task_id / instance_id

    def launch(self, request: LaunchRequest) -> list[Instance]:
        block = f"127.{secrets.randbelow(254) + 1}.{secrets.randbelow(254) + 1}"
        records = self._records_dir(request.task_id)
        records.mkdir(parents=True, exist_ok=True)
        (records / "address-block").write_text(block)
        return self._start_nodes(request, range(request.spec.num_instances), rollback_all=True)

    def add_instances(self, request: LaunchRequest, count: int) -> list[Instance]:
        first = len(self._records(request.task_id))
        return self._start_nodes(request, range(first, first + count), rollback_all=False)

    def _start_nodes(self, request: LaunchRequest, indexes: range,
                     rollback_all: bool) -> list[Instance]:
        """Start one agent per index (its address and GPU slice follow the index)."""
        spec = request.spec
        gpus = local_gpu_count() if spec.gpu is not None else 0
        block = (self._records_dir(request.task_id) / "address-block").read_text()
        package_root = str(Path(flow_sdk.__file__).resolve().parent.parent)
        started: list[Instance] = []
        try:
            for index in indexes:
                started.append(self._start_node(request, index, f"{block}.{index + 1}", gpus,
                                                package_root))
        except OSError as exc:
            if rollback_all:
                self.terminate(request.task_id)
            else:
                self.terminate_instances(request.task_id, [i.instance_id for i in started])
            raise ProviderError(f"could not start local node {len(started) + 1} of "
                                f"{len(indexes)}: {exc}; what had started was stopped") from exc
        return sorted(started, key=lambda i: i.instance_id)

    def _start_node(self, request: LaunchRequest, index: int, address: str, gpus: int,
                    package_root: str) -> Instance:
        instance_id = f"i-{secrets.token_hex(8)}0"
        workdir = self._node_dir(request.task_id, instance_id)
        workdir.mkdir(parents=True)
        env = dict(os.environ)
        env.update(request.boot_env)
        env["FLOW_INSTANCE_ID"] = instance_id
        env["FLOW_NODE_ADDRESS"] = address
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        if gpus and request.spec.gpu is not None:
            count = request.spec.gpu.count
            slot = index % request.spec.num_instances  # a replacement takes over a slice
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(slot * count + g) for g in range(count))
        with open(workdir / "boot.log", "ab") as boot_log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "flow_sdk.agent"], cwd=workdir, env=env,
                stdin=subprocess.DEVNULL, stdout=boot_log, stderr=subprocess.STDOUT,
                start_new_session=True)
        _children[proc.pid] = proc
        launched_at = time.time()
        record = {"instance_id": instance_id, "task_id": request.task_id, "address": address,
                  "pid": proc.pid, "ticks": _process.start_ticks(proc.pid),
                  "launched_at": launched_at, "workdir": str(workdir), "terminated": False}
        (self._records_dir(request.task_id) / f"{instance_id}.json").write_text(json.dumps(record))
        return Instance(instance_id, request.task_id, address, "running", launched_at)

    def _records(self, task_id: str) -> list[dict[str, Any]]:
        folder = self._records_dir(task_id)
        if not folder.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(folder.glob("i-*.json"))]

    def list_instances(self, task_id: str) -> list[Instance]:
        _reap()
        instances = []
        for rec in self._records(task_id):
            alive = not rec["terminated"] and _process.is_alive(rec["pid"], rec["ticks"])
            instances.append(Instance(rec["instance_id"], task_id, rec["address"],
                                      "running" if alive else "terminated", rec["launched_at"]))
        return sorted(instances, key=lambda i: i.instance_id)

    def terminate(self, task_id: str) -> None:
        self._stop(task_id, self._records(task_id))

    def terminate_instances(self, task_id: str, instance_ids: list[str]) -> None:
        self._stop(task_id, [r for r in self._records(task_id) if r["instance_id"] in instance_ids])

    def _stop(self, task_id: str, records: list[dict[str, Any]]) -> None:
        for rec in records:
            workdir = Path(rec["workdir"])
            if _process.is_alive(rec["pid"], rec["ticks"]):
                _process.kill_group(rec["pid"], reap=_reap)
            pids_file = workdir / protocol.WORKER_PGIDS_FILE
            if pids_file.exists():
                for line in pids_file.read_text().split():
                    _process.kill_group(int(line), reap=_reap)
            rec["terminated"] = True
            (self._records_dir(task_id) / f"{rec['instance_id']}.json").write_text(json.dumps(rec))
            if workdir.exists():
                boot_log = workdir / "boot.log"
                if boot_log.exists():  # keep the node's raw boot output beside its logs
                    keep = self.root / "logs" / task_id / "boot"
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(boot_log, keep / f"{rec['instance_id']}.log")
                shutil.rmtree(workdir, ignore_errors=True)
        _reap()

    def live_pids(self, task_id: str) -> list[int]:
        """Agent pids of the task that are still running (for tests and ``flow gc``)."""
        return [rec["pid"] for rec in self._records(task_id)
                if _process.is_alive(rec["pid"], rec["ticks"])]

    def agent_pid(self, task_id: str, instance_id: str) -> int:
        return int(self._record(task_id, instance_id)["pid"])

    def worker_pids(self, task_id: str, instance_id: str) -> list[int]:
        """PIDs of the node's worker processes, once its agent started them."""
        pids_file = Path(self._record(task_id, instance_id)["workdir"]) / protocol.WORKER_PGIDS_FILE
        return [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []

    def _record(self, task_id: str, instance_id: str) -> dict[str, Any]:
        path = self._records_dir(task_id) / f"{instance_id}.json"
        if not path.exists():
            raise ProviderError(f"task {task_id} has no local instance {instance_id}")
        data: dict[str, Any] = json.loads(path.read_text())
        return data
