"""A small TCP key-value store for the node agents (stdlib only).

The leader's agent hosts it; every agent keeps one connection. One JSON object per line each
way. Operations: set, get (None when absent), add (integer counter, returns the new value),
check (all keys present), multi_get. Like torch's TCPStore it has no authentication: it binds
to the leader's private address, and the network around the nodes decides who may reach it.
Node agents use it instead of torch's TCPStore so that they never import torch (seconds of
start-up on every node, and a dependency XGBoost-only nodes do not need).
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from typing import Any


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
            return  # the node at the other end went away: the leader's heartbeat check says so


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


class KVServer:
    """Serve the store on ``host:port`` from a background thread until ``close()``."""

    def __init__(self, host: str, port: int, initial: dict[str, str] | None = None) -> None:
        self._server = _Server((host, port))
        self._server.data.update(initial or {})
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,),
                                        name="kvstore", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        """Stop listening and drop every connection, as the leader's exit would."""
        self._server.shutdown()
        self._server.server_close()
        with self._server.lock:
            connections = list(self._server.connections)
        for conn in connections:
            conn.shutdown(socket.SHUT_RDWR)


class KVClient:
    """One connection to a KVServer. Any socket error raises ``OSError`` to the caller."""

    def __init__(self, host: str, port: int, connect_timeout_s: float,
                 op_timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + connect_timeout_s
        while True:
            try:
                self._sock = socket.create_connection((host, port), timeout=op_timeout_s)
                break
            except (ConnectionRefusedError, socket.timeout):  # not listening yet: retry
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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

    def get(self, key: str) -> str | None:
        value: str | None = self._call({"op": "get", "key": key})
        return value

    def add(self, key: str, amount: int) -> int:
        return int(self._call({"op": "add", "key": key, "amount": amount}))

    def check(self, keys: list[str]) -> bool:
        return bool(self._call({"op": "check", "keys": keys}))

    def multi_get(self, keys: list[str]) -> list[str | None]:
        values: list[str | None] = self._call({"op": "multi_get", "keys": keys})
        return values

    def close(self) -> None:
        self._reader.close()
        self._sock.close()
