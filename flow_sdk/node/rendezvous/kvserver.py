"""The leader's key-value store server: one thread, one ``selectors`` loop, every connection.

A thread per connection does not hold a 1,024-node gang; this loop does: it accepts with a
listen backlog sized for the gang, authenticates each connection (``kvwire``), serves
requests in arrival order, and parks blocking waits (``wait``: until a counter reaches a
value) until the key changes or their timeout passes, so no client polls. A connection that
fails the handshake, sends an oversize line or overflows its reply buffer is dropped; a
malformed request gets an error reply. Nothing a peer sends stops the loop.
"""

from __future__ import annotations

import errno
import heapq
import hmac
import itertools
import json
import resource
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from flow_sdk.node.rendezvous import kvwire
from flow_sdk.wire import safejson

BACKLOG = 4096  # the kernel caps it at net.core.somaxconn
MAX_REPLY_BUFFER = 64 << 20  # a peer that stops reading its replies is dropped
# Connections still in their handshake (each dropped after kvwire.HANDSHAKE_S): past this,
# accepting pauses until one ends, so idle connections cannot take every descriptor.
MAX_UNAUTHENTICATED = 2048
FD_PAUSE_S = 0.05  # out of descriptors: accept again after this, instead of spinning
_WANT_FDS = 65536
_encode = json.JSONEncoder(separators=(",", ":")).encode  # built once: the C encoder


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    nonce: str
    inbuf: bytearray = field(default_factory=bytearray)
    out: bytearray = field(default_factory=bytearray)
    authed: bool = False
    closed: bool = False
    writing: bool = False  # registered for EVENT_WRITE (replies wait in ``out``)
    waiting: _Wait | None = None


@dataclass(eq=False)
class _Wait:
    conn: _Conn
    key: str
    at_least: int
    done: bool = False


def _raise_fd_limit() -> None:
    """Two connections per node: lift the soft open-file limit toward the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = _WANT_FDS if hard == resource.RLIM_INFINITY else min(hard, _WANT_FDS)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class KVServer:
    """Serve the store on ``host:port`` (0: any free port) from a background thread until
    ``close()``. Only clients that prove they hold ``secret`` are served."""

    def __init__(self, host: str, port: int, secret: bytes,
                 initial: dict[str, str] | None = None, backlog: int = BACKLOG) -> None:
        _raise_fd_limit()
        self._secret = secret
        self.data: dict[str, str] = dict(initial or {})
        self._bytes = sum(len(k) + len(v) for k, v in self.data.items())
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(backlog)
        self._listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: set[_Conn] = set()
        self._waiters: dict[str, list[tuple[int, int, _Wait]]] = {}
        self._timers: list[tuple[float, int, _Wait | _Conn]] = []
        self._seq = itertools.count()
        self._resume: list[_Conn] = []  # answered waiters whose queued requests are next
        self._stopping = False
        self.dropped = 0  # connections dropped for failing the handshake or a limit
        self._unauthed = 0  # connections that have not completed the handshake
        self._accepting = True  # the listener is watched (paused when at a limit)
        self._resume_at: float | None = None
        self._thread = threading.Thread(target=self._loop, name="kvstore", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def close(self) -> None:
        """Stop serving and drop every connection, as the leader's exit would."""
        self._stopping = True
        self._wake_w.send(b"x")
        self._thread.join(10.0)
        for conn in list(self._conns):
            self._drop(conn, counted=False)
        self._sel.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            due = [t for t in (self._timers[0][0] if self._timers else None,
                               self._resume_at) if t is not None]
            timeout = max(0.0, min(due) - time.monotonic()) if due else None
            for sel_key, events in self._sel.select(timeout):
                if sel_key.data is None:
                    self._accept()
                elif sel_key.data == "wake":
                    self._wake_r.recv(64)
                else:
                    conn: _Conn = sel_key.data
                    if events & selectors.EVENT_WRITE:
                        self._flush(conn)
                    if events & selectors.EVENT_READ and not conn.closed:
                        self._read(conn)
            self._expire(time.monotonic())
            while self._resume:  # served here, not from inside another peer's request
                self._serve_lines(self._resume.pop())

    def _accept(self) -> None:
        for _ in range(256):  # a burst of arrivals: take many per wake-up
            if self._unauthed >= MAX_UNAUTHENTICATED:
                self._pause_accepting(None)  # until a handshake ends
                return
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, or the peer reset before accept
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._pause_accepting(time.monotonic() + FD_PAUSE_S)  # never spin
                return
            self._unauthed += 1
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, kvwire.new_nonce())
            self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)
            heapq.heappush(self._timers, (time.monotonic() + kvwire.HANDSHAKE_S,
                                          next(self._seq), conn))
            self._send(conn, {"hello": kvwire.VERSION, "nonce": conn.nonce})

    def _pause_accepting(self, until: float | None) -> None:
        """Stop watching the listener until ``until`` (None: until an unauthenticated
        connection completes or is dropped); queued connections wait in the backlog."""
        if self._accepting:
            self._sel.unregister(self._listener)
            self._accepting = False
        self._resume_at = until

    def _resume_accepting(self) -> None:
        if not self._accepting and not self._stopping:
            self._sel.register(self._listener, selectors.EVENT_READ, None)
            self._accepting = True
            self._resume_at = None

    def _handshake_ended(self) -> None:
        self._unauthed -= 1
        if self._resume_at is None and self._unauthed < MAX_UNAUTHENTICATED:
            self._resume_accepting()

    def _expire(self, now: float) -> None:
        if self._resume_at is not None and now >= self._resume_at:
            self._resume_accepting()
        while self._timers and self._timers[0][0] <= now:
            _, _, item = heapq.heappop(self._timers)
            if isinstance(item, _Conn):
                if not item.authed and not item.closed:
                    self._drop(item)
            elif not item.done:
                self._answer_wait(item)

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn, counted=False)
            return
        if not chunk:
            self._drop(conn, counted=False)
            return
        conn.inbuf += chunk
        self._serve_lines(conn)

    def _serve_lines(self, conn: _Conn) -> None:
        limit = kvwire.MAX_LINE if conn.authed else kvwire.MAX_HELLO_LINE
        while not conn.closed and conn.waiting is None:
            end = conn.inbuf.find(b"\n", 0, limit + 1)
            if end < 0:
                if len(conn.inbuf) > limit:  # a line longer than any request may be
                    self._drop(conn)
                return
            line = bytes(conn.inbuf[:end])
            del conn.inbuf[:end + 1]
            try:
                request = safejson.loads(line, max_bytes=limit)
            except safejson.BadJson:  # too deep, too long or not JSON: refused, never raised
                request = None
            if not conn.authed:
                self._handshake(conn, request)
            elif request is None:
                self._send(conn, {"ok": False, "error": "a request must be one line of JSON"})
            else:
                self._apply(conn, request)

    def _handshake(self, conn: _Conn, request: Any) -> None:
        if not (isinstance(request, dict) and isinstance(request.get("auth"), str)
                and kvwire.is_nonce(request.get("nonce"))):
            self._drop(conn)
            return
        expected = kvwire.proof(self._secret, "kv-client", conn.nonce, request["nonce"])
        if not hmac.compare_digest(request["auth"].encode(), expected.encode()):
            self._drop(conn)
            return
        conn.authed = True
        self._handshake_ended()
        self._send(conn, {"ok": True, "auth": kvwire.proof(self._secret, "kv-server",
                                                           conn.nonce, request["nonce"])})

    # -- operations ---------------------------------------------------------------------------

    def _apply(self, conn: _Conn, request: Any) -> None:
        problem = kvwire.problem(request)
        if problem is not None:
            self._send(conn, {"ok": False, "error": problem})
            return
        op = request["op"]
        if op == "set":
            self._send(conn, self._store(request["key"], request["value"]))
        elif op == "get":
            self._send(conn, {"ok": True, "value": self.data.get(request["key"])})
        elif op == "add":
            # A key that holds no integer (a malformed write) restarts as a counter from 0.
            value = (kvwire.as_count(self.data.get(request["key"])) or 0) + request["amount"]
            reply = self._store(request["key"], str(value))
            self._send(conn, {**reply, "value": value} if reply["ok"] else reply)
        elif op == "check":
            self._send(conn, {"ok": True, "value": all(k in self.data for k in request["keys"])})
        elif op == "multi_get":
            self._send(conn, {"ok": True, "value": [self.data.get(k) for k in request["keys"]]})
        elif op == "time":  # the leader's clock, for the nodes' offsets
            self._send(conn, {"ok": True, "value": time.time()})
        else:
            self._start_wait(conn, request["key"], request["at_least"], request["timeout_s"])

    def _store(self, key: str, value: str) -> dict[str, Any]:
        old = self.data.get(key)
        size = self._bytes + len(value) - (len(old) if old is not None else -len(key))
        if size > kvwire.MAX_TOTAL_BYTES:
            return {"ok": False, "error": f"the store is full ({kvwire.MAX_TOTAL_BYTES} bytes)"}
        self.data[key] = value
        self._bytes = size
        self._wake_waiters(key)
        return {"ok": True}

    def _start_wait(self, conn: _Conn, key: str, at_least: int, timeout_s: float) -> None:
        count = kvwire.as_count(self.data.get(key))
        if count is not None and count >= at_least:
            self._send(conn, {"ok": True, "value": count})
            return
        wait = _Wait(conn, key, at_least)
        conn.waiting = wait
        heapq.heappush(self._waiters.setdefault(key, []), (at_least, next(self._seq), wait))
        heapq.heappush(self._timers, (time.monotonic() + timeout_s, next(self._seq), wait))

    def _wake_waiters(self, key: str) -> None:
        heap = self._waiters.get(key)
        if not heap:
            return
        count = kvwire.as_count(self.data.get(key))
        while heap and (heap[0][2].done or (count is not None and heap[0][0] <= count)):
            _, _, wait = heapq.heappop(heap)
            if not wait.done:
                self._answer_wait(wait)
        if not heap:
            del self._waiters[key]

    def _answer_wait(self, wait: _Wait) -> None:
        """Reply with the key's count now (the caller compares it with what it waited for)."""
        wait.done = True
        conn = wait.conn
        conn.waiting = None
        if conn.closed:
            return
        self._send(conn, {"ok": True, "value": kvwire.as_count(self.data.get(wait.key)) or 0})
        if conn.inbuf:  # requests that arrived while it waited
            self._resume.append(conn)

    # -- sending and dropping -----------------------------------------------------------------

    def _send(self, conn: _Conn, reply: dict[str, Any]) -> None:
        if conn.closed:
            return
        pending = bool(conn.out)
        conn.out += _encode(reply).encode() + b"\n"
        if len(conn.out) > MAX_REPLY_BUFFER:
            self._drop(conn)
        elif not pending:
            self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        if conn.closed:
            return
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(conn, counted=False)
            return
        del conn.out[:sent]
        if bool(conn.out) != conn.writing:
            conn.writing = bool(conn.out)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.writing else 0)
            self._sel.modify(conn.sock, events, conn)

    def _drop(self, conn: _Conn, counted: bool = True) -> None:
        if conn.closed:
            return
        conn.closed = True
        if not conn.authed:
            self._handshake_ended()
        if conn.waiting is not None:
            conn.waiting.done = True
        self._conns.discard(conn)
        if counted:
            self.dropped += 1
        self._sel.unregister(conn.sock)
        conn.sock.close()
