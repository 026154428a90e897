"""BASELINE ONLY: a faithful copy of the rendezvous store before it was rebuilt, for
``bench/rendezvous.py`` to compare against in the same run. Not used by the product.

The old design: ``socketserver.ThreadingTCPServer`` (a thread per connection, the default
listen backlog of 5), no authentication, a 30 s socket timeout on every client operation, and
a start barrier that every node polls with ``check`` every 20 ms.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from typing import Any

from flow_sdk.node.rendezvous.kvstore import dial


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def handle(self) -> None:
        try:
            for line in self.rfile:
                request = json.loads(line)
                reply = self.server.apply(request)
                self.wfile.write(json.dumps(reply).encode() + b"\n")
        except ConnectionError:
            return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        self.data: dict[str, str] = {}
        self.lock = threading.Lock()
        self.connections: set[socket.socket] = set()

    def apply(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        with self.lock:
            if op == "set":
                self.data[request["key"]] = request["value"]
                return {"ok": True}
            if op == "get":
                return {"ok": True, "value": self.data.get(request["key"])}
            if op == "add":
                value = int(self.data.get(request["key"], "0")) + int(request["amount"])
                self.data[request["key"]] = str(value)
                return {"ok": True, "value": value}
            if op == "check":
                return {"ok": True, "value": all(k in self.data for k in request["keys"])}
            if op == "multi_get":
                return {"ok": True, "value": [self.data.get(k) for k in request["keys"]]}
        return {"ok": False, "error": f"unknown operation {op!r}"}


class OldKVServer:
    def __init__(self, host: str, port: int) -> None:
        self._server = _Server((host, port))
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,),
                                        name="kvstore", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._server.lock:
            connections = list(self._server.connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                continue


class OldKVClient:
    def __init__(self, host: str, port: int, connect_timeout_s: float,
                 op_timeout_s: float = 30.0) -> None:
        self._sock = dial(host, port, connect_timeout_s, op_timeout_s)  # the same connect loop
        self._reader = self._sock.makefile("rb")
        self._lock = threading.Lock()

    def _call(self, request: dict[str, Any]) -> Any:
        with self._lock:
            self._sock.sendall(json.dumps(request).encode() + b"\n")
            line = self._reader.readline()
        if not line:
            raise ConnectionResetError("the store closed the connection")
        reply = json.loads(line)
        if not reply["ok"]:
            raise ValueError(reply["error"])
        return reply.get("value")

    def set(self, key: str, value: str) -> None:
        self._call({"op": "set", "key": key, "value": value})

    def add(self, key: str, amount: int) -> int:
        return int(self._call({"op": "add", "key": key, "amount": amount}))

    def check(self, keys: list[str]) -> bool:
        return bool(self._call({"op": "check", "keys": keys}))

    def close(self) -> None:
        self._reader.close()
        self._sock.close()


def old_barrier(client: OldKVClient, rank: int, num_nodes: int, timeout_s: float,
                poll_s: float = 0.02) -> None:
    """The old NodeStore.barrier: set this node's key, then poll ``check`` every 20 ms."""
    client.set(f"g0/start/{rank}", "1")
    keys = [f"g0/start/{r}" for r in range(num_nodes)]
    deadline = time.monotonic() + timeout_s
    while not client.check(keys):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"barrier timed out after {timeout_s:.0f}s")
        time.sleep(poll_s)


def old_watch_tick(client: OldKVClient, rank: int) -> None:
    """What the old agent sent every watch tick besides its heartbeat: the failure check."""
    client.check(["g0/fail/count"])
