"""Preflight: before user code runs, every node proves it reaches every other node.

Each node listens on a probe port of its own address; the leader also binds the collective
``MASTER_PORT`` (proving it is free there). Every node connects to every other node's probe
port and to the leader's MASTER_PORT, and reports what failed. Any failure fails the task
with the pairs that could not talk, before a worker starts.
"""

from __future__ import annotations

import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from flow_sdk.errors import RendezvousError
from flow_sdk.node.rendezvous import kvwire
from flow_sdk.node.rendezvous.store import NodeStore


@dataclass(frozen=True)
class Target:
    node: int
    address: str
    port: int
    what: str  # "probe port" | "MASTER_PORT"


class ProbeListener:
    """Accepts and closes connections on ``address:port`` (0: any free port)."""

    def __init__(self, address: str, port: int = 0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((address, port))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="preflight", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()


def probe(targets: list[Target], timeout_s: float) -> list[str]:
    """Connect to every target in parallel; one line per target that could not be reached."""

    def attempt(target: Target) -> str | None:
        try:
            with socket.create_connection((target.address, target.port), timeout=timeout_s):
                return None
        except OSError as exc:
            return (f"node {target.node}'s {target.what} at {target.address}:{target.port} "
                    f"({exc.strerror or exc})")

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(targets)))) as pool:
        return [line for line in pool.map(attempt, targets) if line is not None]


def _failure_lines(raw: str | None) -> list[str]:
    """A node's published probe failures; a malformed value is reported, never trusted."""
    try:
        lines = json.loads(raw or "[]")
    except ValueError:
        lines = None
    if isinstance(lines, list) and all(isinstance(line, str) for line in lines):
        return lines
    return ["(its preflight report was malformed)"]


def run_preflight(store: NodeStore, master_port: int, timeout_s: float) -> str:
    """Check every pair; returns a summary line or raises RendezvousError naming the pairs."""
    m = store.m
    own = m.addresses[m.node_rank]
    listeners: list[ProbeListener] = []
    try:
        for port, what in [(0, "a probe port")] + ([(master_port, "MASTER_PORT")]
                                                   if m.is_leader else []):
            try:
                listeners.append(ProbeListener(own, port))
            except OSError as exc:
                raise RendezvousError(f"preflight failed: node {m.node_rank} ({own}) cannot "
                                      f"listen on {what} {port}: {exc.strerror or exc}") from exc
        store.publish("preflight/port", str(listeners[0].port))
        store.barrier("preflight-up", timeout_s)
        ports = store.gather("preflight/port")
        targets = [Target(n, m.addresses[n], kvwire.as_count(port) or 0, "probe port")
                   for n, port in enumerate(ports) if n != m.node_rank]
        if not m.is_leader:
            targets.append(Target(0, m.leader_address, master_port, "MASTER_PORT"))
        store.publish("preflight/failures", json.dumps(probe(targets, min(5.0, timeout_s))))
        store.barrier("preflight-done", timeout_s)
        reports = store.gather("preflight/failures")
    finally:
        for listener in listeners:
            listener.close()
    failures = [f"node {n} ({m.addresses[n]}) cannot reach {line}"
                for n, raw in enumerate(reports) for line in _failure_lines(raw)]
    if failures:
        raise RendezvousError("preflight failed: " + "; ".join(failures)
                              + ". Check the security group / firewall between the nodes.")
    pairs = m.num_nodes * (m.num_nodes - 1)
    return f"preflight: {m.num_nodes} nodes, {pairs} node pairs and MASTER_PORT reachable"
