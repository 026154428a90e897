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
ports, and starting / stopping the node processes. Replacement nodes (``add_instances``, called
by a node agent under ``max_restarts``) are started the same way, from that agent's process;
``terminate_instances`` stops the named nodes' processes by pid.

``FakeImds`` is a small IMDSv2 on 127.0.0.1 that a test points ``imds_endpoint`` at, to play
spot interruption notices.
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
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
        stopped = [pid for rec in self._records(task_id) for pid in self._stop_node(rec)]
        _reap()
        return stopped

    def stop_instances(self, task_id: str, instance_ids: Sequence[str]) -> list[int]:
        """Stop the processes of the named nodes of the task only (by their recorded pids);
        returns the agent pids that were still running. Idempotent."""
        wanted = set(instance_ids)
        stopped = [pid for rec in self._records(task_id) if rec["instance_id"] in wanted
                   for pid in self._stop_node(rec)]
        _reap()
        return stopped

    def _stop_node(self, rec: Mapping[str, Any]) -> list[int]:
        stopped = []
        if _process.is_alive(rec["pid"], rec["ticks"]):
            _process.kill_group(rec["pid"], reap=_reap)
            stopped.append(int(rec["pid"]))
        workdir = Path(rec["workdir"])
        pids_file = workdir / protocol.WORKER_PGIDS_FILE
        if pids_file.exists():
            for line in pids_file.read_text().split():
                _process.kill_group(int(line), reap=_reap)
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


class FakeImds:
    """A small IMDSv2 for the simulated cloud, on 127.0.0.1, that a test controls.

    ``PUT /latest/api/token`` (with the TTL header) hands out a session token; every ``GET``
    needs it in ``X-aws-ec2-metadata-token`` and gets 401 without it, as on an instance
    launched with ``HttpTokens=required``. Paths may start with ``/<instance id>``, so one
    server plays each node's own IMDS (``imds_endpoint = endpoint + "/{instance_id}"``).
    ``GET .../latest/meta-data/spot/instance-action`` is 404 until ``interrupt`` is called.
    """

    def __init__(self) -> None:
        self.notices: dict[str, str] = {}  # instance id ("" = every node) -> notice JSON
        self.tokens: set[str] = set()
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise ProviderError("FakeImds is not started")
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> FakeImds:
        imds = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return  # the test reads ``requests`` instead

            def _answer(self, status: int, body: str = "") -> None:
                with imds._lock:  # recorded before the caller can see the answer
                    imds.requests.append((self.command, self.path, status))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _split(self) -> tuple[str, str]:
                parts = self.path.split("/", 2)  # "", first segment, rest
                if len(parts) == 3 and parts[1] != "latest":
                    return parts[1], "/" + parts[2]
                return "", self.path

            def do_PUT(self) -> None:
                _instance, path = self._split()
                if path != "/latest/api/token" or not self.headers.get(
                        "X-aws-ec2-metadata-token-ttl-seconds"):
                    self._answer(400, "token requests need the TTL header")
                    return
                token = secrets.token_urlsafe(24)
                with imds._lock:
                    imds.tokens.add(token)
                self._answer(200, token)

            def do_GET(self) -> None:
                instance, path = self._split()
                with imds._lock:
                    valid = self.headers.get("X-aws-ec2-metadata-token") in imds.tokens
                    notice = imds.notices.get(instance, imds.notices.get(""))
                if not valid:
                    self._answer(401)
                elif path == "/latest/meta-data/spot/instance-action" and notice is not None:
                    self._answer(200, notice)
                else:
                    self._answer(404)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fake-imds",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def interrupt(self, instance_id: str = "", action: str = "terminate",
                  in_s: float = 120.0) -> str:
        """Post a spot interruption notice for one node (every node for ""); returns it."""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + in_s))
        notice = json.dumps({"action": action, "time": when})
        with self._lock:
            self.notices[instance_id] = notice
        return notice

    def revoke_tokens(self) -> None:
        """Forget every token handed out (as when IMDS restarts or a token expires)."""
        with self._lock:
            self.tokens.clear()
