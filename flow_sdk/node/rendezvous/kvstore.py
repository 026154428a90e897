"""A small authenticated TCP key-value store for the node agents (stdlib only).

The leader's agent hosts it (``KVServer``, an event loop in one thread); every agent keeps a
connection (``KVClient``). Operations: set, get (None when absent), add (integer counter,
returns the new value), check (all keys present), multi_get, and wait (block on the server
until a counter reaches a value). Every connection proves at connect that it holds the task's
secret, and the server proves it back (``kvwire``); the secret itself never crosses the
wire. Node agents use it instead of torch's TCPStore so that they never import torch.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import socket
import threading
import time
from typing import Any

from flow_sdk.errors import RendezvousError
from flow_sdk.node.rendezvous import kvwire
from flow_sdk.node.rendezvous.kvserver import KVServer
from flow_sdk.wire import safejson

OP_TIMEOUT_S = 5.0  # an answer slower than this means the leader is frozen or gone

__all__ = ["KVClient", "KVServer", "OP_TIMEOUT_S", "StoreRefused", "dial"]
_encode = json.JSONEncoder(separators=(",", ":")).encode  # built once: the C encoder


class StoreRefused(RendezvousError):
    """The store answered, but refused the request (malformed, or a limit was reached)."""


def dial(host: str, port: int, connect_timeout_s: float, op_timeout_s: float) -> socket.socket:
    """A TCP connection (no delay) to ``host:port``, retried while nothing listens there yet."""
    deadline = time.monotonic() + connect_timeout_s
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=op_timeout_s)
            break
        except (ConnectionRefusedError, socket.timeout):  # not listening yet: retry
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class KVClient:
    """One authenticated connection to a KVServer. A socket error or a reply later than
    ``op_timeout_s`` raises ``OSError``, and every later call raises at once."""

    def __init__(self, host: str, port: int, secret: bytes, connect_timeout_s: float,
                 op_timeout_s: float = OP_TIMEOUT_S) -> None:
        self._sock = dial(host, port, connect_timeout_s, op_timeout_s)
        self._reader = self._sock.makefile("rb")
        self._lock = threading.Lock()
        self._op_timeout_s = op_timeout_s
        self._broken: OSError | None = None
        self._authenticate(secret, f"{host}:{port}")

    def _authenticate(self, secret: bytes, where: str) -> None:
        hello = self._read_line()
        if not (isinstance(hello, dict) and hello.get("hello") == kvwire.VERSION
                and kvwire.is_nonce(hello.get("nonce"))):
            self.close()
            raise RendezvousError(f"{where} is not a flow-sdk store ({kvwire.VERSION})")
        nonce = kvwire.new_nonce()
        self._write({"auth": kvwire.proof(secret, "kv-client", hello["nonce"], nonce),
                     "nonce": nonce})
        reply = self._read_line()
        expected = kvwire.proof(secret, "kv-server", hello["nonce"], nonce)
        if not (isinstance(reply, dict) and isinstance(reply.get("auth"), str)
                and hmac.compare_digest(reply["auth"].encode(), expected.encode())):
            self.close()
            raise RendezvousError(f"the store at {where} did not prove it holds the task's "
                                  "secret; refusing to use it")

    def _write(self, request: dict[str, Any]) -> None:
        self._sock.sendall(_encode(request).encode() + b"\n")

    def _read_line(self) -> Any:
        line = self._reader.readline(kvwire.MAX_LINE + 1)
        if not line:
            raise ConnectionResetError("the store closed the connection")
        if not line.endswith(b"\n"):
            raise ConnectionResetError("the store sent an oversize reply")
        try:
            return safejson.loads(line, max_bytes=kvwire.MAX_LINE + 1)
        except safejson.BadJson:
            raise ConnectionResetError("the store sent a malformed reply") from None

    def _call(self, request: dict[str, Any], wait_s: float = 0.0) -> Any:
        with self._lock:
            if self._broken is not None:
                raise self._broken
            try:
                self._sock.settimeout(self._op_timeout_s + wait_s)
                self._write(request)
                reply = self._read_line()
            except OSError as exc:  # the connection is unusable from here on
                self._broken = exc
                raise
        if not isinstance(reply, dict) or not reply.get("ok"):
            error = reply.get("error") if isinstance(reply, dict) else reply
            raise StoreRefused(f"the store refused {request.get('op')}: {error}")
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

    def server_time(self) -> float:
        """The store's clock (epoch seconds) when it answered."""
        return float(self._call({"op": "time"}))

    def wait(self, key: str, at_least: int, timeout_s: float) -> int:
        """Block until the counter ``key`` is ``at_least`` or ``timeout_s`` passed (at most
        ``kvwire.MAX_WAIT_S``); returns the counter's value then (0 when absent)."""
        timeout_s = min(max(0.0, timeout_s), kvwire.MAX_WAIT_S)
        return int(self._call({"op": "wait", "key": key, "at_least": at_least,
                               "timeout_s": timeout_s}, wait_s=timeout_s))

    def close(self) -> None:
        """Close the connection; a thread blocked in a call gets an ``OSError``."""
        with contextlib.suppress(OSError):  # already reset by the peer: nothing to shut down
            self._sock.shutdown(socket.SHUT_RDWR)
        self._reader.close()
        self._sock.close()
