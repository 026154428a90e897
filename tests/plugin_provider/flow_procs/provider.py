"""The procs provider: every node is a process on this machine that installs what it runs
from a shared directory (``root``), as a node of a cluster with a shared filesystem would.

Storage is the SDK's file-backed object and log store on that directory. A launch ships the
SDK's wheel and this distribution's wheel into the store by digest
(``flow_sdk.providers.launch.ship_wheels``) and the node bootstrap (``boot.py``) beside them;
each node gets its own folder, a 0600 boot file and a launch file naming the wheels, and is
started as ``python -I -S boot.py LAUNCH_FILE`` in a session of its own. Its record (pid and
start time) is written before it starts, so a launch that stops half-way is stopped whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from flow_sdk.errors import FieldProblem, ProviderError
from flow_sdk.providers.base import (
    Instance,
    InstanceState,
    LaunchPlan,
    LaunchRequest,
    LogStore,
    ObjectStore,
    Provider,
)
from flow_sdk.providers.gcreport import GcReport
from flow_sdk.providers.files import FileLogStore, FileObjectStore, private_dirs, replace_file
from flow_sdk.providers.launch import NodeLaunch, node_launch, ship_wheels
from flow_sdk.spec import TaskSpec
from flow_sdk.wire import envvars

BOOT_SCRIPT = Path(__file__).with_name("boot.py")
STOP_WAIT_S = 5.0  # after SIGTERM, how long a node's agent may take to stop its workers


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None once it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_children: dict[int, subprocess.Popen[bytes]] = {}  # nodes this process started, to reap


def spawn(argv: list[str], workdir: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start one node's bootstrap, its output in the node's ``boot.log``."""
    with open(workdir / "boot.log", "ab") as out:
        proc = subprocess.Popen(argv, cwd=workdir, env=dict(env), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    _children[proc.pid] = proc
    return proc


class ProcsProvider(Provider):
    name: ClassVar[str] = "procs"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._store = FileObjectStore(root / "store")
        self._logs = FileLogStore(root / "logs")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ProcsProvider:
        unknown = sorted(set(config) - {"root"})
        if unknown:
            raise ProviderError(f"provider_config has unknown key(s) {unknown} for the procs "
                                "provider; its one key is root (the shared directory)")
        root = config.get("root")
        return cls(Path(root) if root else Path.home() / ".flow-procs")

    def config(self) -> dict[str, Any]:
        return {"root": str(self.root)}

    @property
    def store(self) -> ObjectStore:
        return self._store

    @property
    def logs(self) -> LogStore:
        return self._logs

    def check(self, spec: TaskSpec) -> list[FieldProblem]:
        if spec.gpu is not None:
            return [FieldProblem("gpu", "the procs provider runs CPU nodes only; drop gpu=")]
        return []

    def plan(self, spec: TaskSpec) -> LaunchPlan:
        return LaunchPlan(self.name, "process", "local", "local", 0.0, spec.num_instances,
                          spec.max_run_time_hours, workers_per_node=spec.slots_per_node,
                          summary=f"procs: {spec.num_instances} node process(es) over "
                                  f"{self.root}; costs nothing")

    def rendezvous_ports(self) -> tuple[int, int]:
        return _free_port(), _free_port()  # the nodes share this machine's ports

    # -- nodes ----------------------------------------------------------------------------

    def _records_dir(self, task_id: str) -> Path:
        return self.root / "instances" / task_id

    def _records(self, task_id: str) -> list[dict[str, Any]]:
        folder = self._records_dir(task_id)
        return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] \
            if folder.is_dir() else []

    def launch(self, request: LaunchRequest) -> list[Instance]:
        private_dirs(self.root)
        launch = node_launch(request, ship_wheels(self._store, self.name))
        boot_script = self._boot_script()
        block = f"127.{secrets.randbelow(254) + 1}.{secrets.randbelow(254) + 1}"
        count = request.spec.num_instances
        started: list[Instance] = []
        try:
            for index in range(count):
                started.append(self._start_node(request, launch, f"p-{secrets.token_hex(8)}",
                                                f"{block}.{index + 1}", boot_script))
        except OSError as exc:
            self.terminate(request.task_id)
            raise ProviderError(f"procs: node {len(started) + 1} of {count} did not start "
                                f"({exc}); the nodes that had started were stopped") from exc
        return sorted(started, key=lambda i: i.instance_id)

    def _boot_script(self) -> Path:
        """The node bootstrap in the shared directory, by digest (what the nodes run)."""
        data = BOOT_SCRIPT.read_bytes()
        path = self.root / "boot" / f"{hashlib.sha256(data).hexdigest()[:16]}.py"
        if not path.exists():
            private_dirs(path.parent)
            replace_file(path, data.decode("utf-8"))
        return path

    def _start_node(self, request: LaunchRequest, launch: NodeLaunch, instance_id: str,
                    address: str, boot_script: Path) -> Instance:
        """This provider's render of ``launch``: the node's 0600 boot file and its launch
        file (the wheels, the Python it must run, the module and its environment)."""
        task_id = request.task_id
        workdir = self.root / "nodes" / task_id / instance_id
        private_dirs(workdir)
        boot_file = workdir / "boot.json"
        fd = os.open(boot_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(launch.boot_text())  # it carries the task's secret
        launch_file = workdir / "launch.json"
        cores = max(1, (os.cpu_count() or 1) // request.spec.num_instances)
        replace_file(launch_file, json.dumps({
            "wheels": [{"path": str(self._store.root / w.key), "sha256": w.sha256,
                        "filename": w.filename} for w in launch.wheels],
            "python": launch.python, "site": str(workdir / "site"), "module": launch.module,
            "env": {**launch.agent_env(instance_id, address, boot_file),
                    envvars.NODE_CORES: str(cores)}}))
        record: dict[str, Any] = {"instance_id": instance_id, "task_id": task_id,
                                  "address": address, "workdir": str(workdir),
                                  "launched_at": time.time(), "terminated": False,
                                  "wheels": [w.filename for w in launch.wheels]}
        path = self._records_dir(task_id) / f"{instance_id}.json"
        private_dirs(path.parent)
        replace_file(path, json.dumps(record))  # before it starts: a stop finds it
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = spawn([sys.executable, "-I", "-S", str(boot_script), str(launch_file)],
                     workdir, env)
        record.update(pid=proc.pid, ticks=_start_ticks(proc.pid))
        replace_file(path, json.dumps(record))
        return _instance(record, "running")

    @staticmethod
    def _alive(record: Mapping[str, Any]) -> bool:
        for pid, proc in list(_children.items()):
            if proc.poll() is not None:
                del _children[pid]
        return "pid" in record and record["ticks"] is not None and \
            _start_ticks(record["pid"]) == record["ticks"]

    def list_instances(self, task_id: str) -> list[Instance]:
        return sorted((_instance(r, "running" if not r["terminated"] and self._alive(r)
                                 else "terminated") for r in self._records(task_id)),
                      key=lambda i: i.instance_id)

    def terminate(self, task_id: str) -> None:
        records = self._records(task_id)
        live = [r for r in records if self._alive(r)]
        for record in live:
            os.killpg(record["pid"], signal.SIGTERM)  # the agent stops its workers
        deadline = time.monotonic() + STOP_WAIT_S
        while any(self._alive(r) for r in live) and time.monotonic() < deadline:
            time.sleep(0.05)
        for record in live:
            if self._alive(record):
                os.killpg(record["pid"], signal.SIGKILL)
        for record in records:
            record["terminated"] = True
            replace_file(self._records_dir(task_id) / f"{record['instance_id']}.json",
                         json.dumps(record))
            shutil.rmtree(record["workdir"], ignore_errors=True)

    def gc(self, *, dry_run: bool = False, ended: Mapping[str, str] | None = None
           ) -> GcReport:
        """Stop the nodes of the tasks ``ended`` names (``flow_sdk.lifecycle`` judged them
        ended) and of tasks whose every node stopped; the others live."""
        report = GcReport(self.name, dry_run)
        folder = self.root / "instances"
        for task_dir in sorted(folder.iterdir()) if folder.is_dir() else []:
            records = self._records(task_dir.name)
            live = [r for r in records if not r["terminated"] and self._alive(r)]
            if not any(not r["terminated"] for r in records):
                continue
            why = (ended or {}).get(task_dir.name) or (
                None if live else "every node of it has stopped")
            if why is None:
                report.live_tasks.append(task_dir.name)
                continue
            report.reasons[task_dir.name] = why
            report.stopped_processes.extend(r["pid"] for r in live)
            if not dry_run:
                self.terminate(task_dir.name)
        return report


def _instance(record: Mapping[str, Any], state: InstanceState) -> Instance:
    return Instance(record["instance_id"], record["task_id"], record["address"], state,
                    record["launched_at"], market="local", instance_type="process")
