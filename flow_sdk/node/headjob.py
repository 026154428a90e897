"""Snowflake's job model (``run_on="head"``): the entry point runs on the head only (rank 0),
and every other worker of the task serves the head's distributed calls.

    @app.function(num_instances=3, run_on="head")
    def job() -> float:
        booster = XGBEstimator(params).fit(data, cols, "y")   # on all 3 nodes of this task
        ...

How it runs: every worker of such a task runs its call through :func:`run_head_only` (the
agent gives the workers of a ``run_on="head"`` task the link key, ``FLOW_HEAD_JOB_KEY``, and the worker
program routes the call here when it holds one). Rank 0 listens on
``(MASTER_ADDR, MASTER_PORT)`` and runs the function; the others connect there (retrying until
the head listens) and wait. A trainer called on the head asks :func:`active` for the pool and
hands it a function: the pool sends it to the workers it picks, runs the head's own share in the
calling thread, and returns every participant's result in rank order. Each participant runs the
function with the torchrun variables of that call's layout (``RANK``, ``WORLD_SIZE``, ...,
``MASTER_PORT`` a fresh port), restored afterwards. When the function returns, the head tells
the workers to stop and they exit with ``None``.

The head's own environment is the job's (``WORLD_SIZE`` counts every worker), so a head script
does not call ``init_process_group`` itself; the trainers' calls do, inside the call's layout.
``MASTER_PORT`` is the pool's for the life of the job; each call gets a port of its own.

The link is authenticated with a key derived from the task's secret (:func:`link_key`), which
the node agent puts in each worker's environment (``FLOW_HEAD_JOB_KEY``); it is never in the payload,
which the object store holds in the clear. A worker proves it holds the key before it is sent
anything, and every message in either direction carries an HMAC over its sequence number and
the connection's nonce.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import struct
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from flow_sdk import payload
from flow_sdk.node import current
from flow_sdk.wire import signing
from flow_sdk.errors import FlowError
from flow_sdk.system.procs import free_port
from flow_sdk.wire import envvars

CONNECT_TIMEOUT_S = 600.0  # how long a worker keeps trying to reach the head
_POLL_S = 0.1
_NONCE = 16
_TAG = 32
_HEADER = struct.Struct("!Q")
HANDSHAKE_S = 5.0  # a connection that has not proved itself by then is closed
MAX_PENDING = 64  # handshakes at once; more connections wait in the listen backlog
MAX_FRAME = 1 << 31  # a message larger than this is refused before it is read


class HeadJobError(FlowError, RuntimeError):
    """The head and its workers could not connect, or a worker's share of a call failed."""


def link_key(secret: bytes) -> str:
    """The head job's link key (hex) for a task's secret: the agent sets it as ``FLOW_HEAD_JOB_KEY``.
    Derived, so a worker's environment never holds the secret that signs the task's store."""
    return signing.derive_key(secret, signing.Purpose.HEAD_JOB_LINK).hex()


def _key_from_env() -> bytes:
    value = os.environ.get(envvars.HEAD_JOB_KEY, "")
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise HeadJobError(f"{envvars.HEAD_JOB_KEY} must hold the head job's 64-hex-digit link key, "
                           "which the node agent sets; run run_on='head' tasks through FlowApp")
    return bytes.fromhex(value)


# -- framing ----------------------------------------------------------------------------------


class _Link:
    """One authenticated connection: length, HMAC tag, body; sequence numbers per direction."""

    def __init__(self, sock: socket.socket, key: bytes, nonce: bytes, head: bool) -> None:
        self.sock = sock
        self._key = key
        self._nonce = nonce
        self._send_dir, self._recv_dir = (b"h", b"w") if head else (b"w", b"h")
        self._sent = 0
        self._received = 0

    def _tag(self, direction: bytes, seq: int, body: bytes) -> bytes:
        return hmac.new(self._key, self._nonce + direction + struct.pack("!Q", seq) + body,
                        hashlib.sha256).digest()

    def send(self, obj: Any) -> None:
        body = payload.dumps(obj)
        self.sock.sendall(_HEADER.pack(len(body)) + self._tag(self._send_dir, self._sent, body)
                          + body)
        self._sent += 1

    def receive(self) -> Any:
        """The next message; ``HeadJobError`` when the peer closed or the tag is wrong."""
        (size,) = _HEADER.unpack(_read_exact(self.sock, _HEADER.size))
        if size > MAX_FRAME:
            raise HeadJobError(f"a message of {size} bytes between the head and a worker is "
                               f"over the {MAX_FRAME}-byte limit; refusing it")
        tag = _read_exact(self.sock, _TAG)
        body = _read_exact(self.sock, size)
        if not hmac.compare_digest(tag, self._tag(self._recv_dir, self._received, body)):
            raise HeadJobError("a message between the head and a worker failed its "
                               "authentication check; refusing to unpickle it")
        self._received += 1
        return payload.loads(body)


def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise HeadJobError("the connection between the head and a worker closed")
        data += chunk
    return bytes(data)


def _proof(key: bytes, nonce: bytes, rank: int) -> bytes:
    """A worker's proof that it holds the job's key (over the head's nonce)."""
    return hmac.new(key, b"join" + nonce + struct.pack("!Q", rank), hashlib.sha256).digest()


def _head_proof(key: bytes, nonce: bytes, worker_nonce: bytes, rank: int) -> bytes:
    """The head's proof, over both nonces: a worker trusts only a head that holds the key."""
    return hmac.new(key, b"head" + nonce + worker_nonce + struct.pack("!Q", rank),
                    hashlib.sha256).digest()


# -- what one participant runs ----------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    env: dict[str, str]


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def layout_env(job_ranks: Sequence[int], workers_per_node: int, index: int, master_port: int
               ) -> dict[str, str]:
    """torchrun's variables for participant ``index`` of a call on ``job_ranks`` (ranks of
    the job, ``workers_per_node`` per node), rank ``index`` of the call."""
    nodes = [r // workers_per_node for r in job_ranks]
    node = nodes[index]
    local = [i for i, n in enumerate(nodes) if n == node]
    world = str(len(job_ranks))
    return {"RANK": str(index), "ROLE_RANK": str(index), "WORLD_SIZE": world,
            "ROLE_WORLD_SIZE": world, "LOCAL_RANK": str(local.index(index)),
            "LOCAL_WORLD_SIZE": str(len(local)), "GROUP_RANK": str(node),
            "NODE_RANK": str(node), envvars.NODE_RANK: str(node),
            "GROUP_WORLD_SIZE": str(len(set(nodes))), envvars.NUM_NODES: str(len(set(nodes))),
            "MASTER_PORT": str(master_port)}


# -- the head's side --------------------------------------------------------------------------


class HeadPool:
    """The job's workers as the head sees them: ``run`` a function on some or all of them."""

    def __init__(self, key: bytes, address: str, port: int, world_size: int,
                 workers_per_node: int) -> None:
        self.address = address
        self.world_size = world_size
        self.workers_per_node = workers_per_node
        self.num_nodes = world_size // workers_per_node
        self._key = key
        self._links: dict[int, _Link] = {}
        self._joined = threading.Condition()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server = socket.create_server((address, port))
        self._server.settimeout(_POLL_S)
        self._thread = threading.Thread(target=self._accept, name="flow-head-pool", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        """Admit connections, each handshake in a thread of its own with a deadline (at most
        ``MAX_PENDING`` at once), so idle or slow peers cannot hold the workers out."""
        pending = threading.BoundedSemaphore(MAX_PENDING)
        with self._server:
            while not self._closing.is_set() and len(self._links) < self.world_size - 1:
                if not pending.acquire(timeout=_POLL_S):
                    continue
                try:
                    conn, _ = self._server.accept()
                except TimeoutError:
                    pending.release()
                    continue
                threading.Thread(target=self._admit, args=(conn, pending), daemon=True,
                                 name="flow-head-admit").start()

    def _admit(self, conn: socket.socket, pending: threading.BoundedSemaphore) -> None:
        try:
            self._handshake(conn)
        finally:
            pending.release()

    def _handshake(self, conn: socket.socket) -> None:
        nonce = secrets.token_bytes(_NONCE)
        conn.settimeout(HANDSHAKE_S)
        try:
            conn.sendall(nonce)
            rank = struct.unpack("!Q", _read_exact(conn, 8))[0]
            proof = _read_exact(conn, _TAG)
            worker_nonce = _read_exact(conn, _NONCE)
            if not 0 < rank < self.world_size or not hmac.compare_digest(
                    proof, _proof(self._key, nonce, rank)):
                conn.close()  # not one of this job's workers
                return
            conn.sendall(_head_proof(self._key, nonce, worker_nonce, rank))
        except (OSError, HeadJobError):
            conn.close()
            return
        conn.settimeout(None)
        with self._joined:
            self._links[rank] = _Link(conn, self._key, nonce, head=True)
            self._joined.notify_all()

    def _missing_after(self, ranks: Sequence[int], timeout_s: float) -> list[int]:
        """Wait up to ``timeout_s`` for ``ranks`` to connect; those that have not."""
        deadline = time.monotonic() + timeout_s
        with self._joined:
            while True:
                missing = [r for r in ranks if r not in self._links]
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return missing
                self._joined.wait(min(left, 1.0))

    def _wait_for(self, ranks: Sequence[int], timeout_s: float) -> None:
        missing = self._missing_after(ranks, timeout_s)
        if missing:
            raise HeadJobError(f"worker rank(s) {missing} of this job did not connect "
                               f"to the head within {timeout_s:.0f}s")

    def ranks(self, num_nodes: int | None = None, workers_per_node: int | None = None
              ) -> list[int]:
        """The job ranks of the first ``num_nodes`` nodes, first ``workers_per_node`` workers
        each (``None``: all)."""
        nodes = self.num_nodes if num_nodes is None else num_nodes
        per = self.workers_per_node if workers_per_node is None else workers_per_node
        return [n * self.workers_per_node + w for n in range(nodes) for w in range(per)]

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], ranks: Sequence[int],
            timeout_s: float = CONNECT_TIMEOUT_S) -> list[Any]:
        """Run ``fn(*args)`` on the job ranks ``ranks`` (which start with 0, the head, which
        runs its share here) and return their results in that order. A worker's exception
        is raised here."""
        if not ranks or ranks[0] != 0:
            raise HeadJobError(f"a call must include the head (rank 0) first, got {list(ranks)}")
        with self._lock:
            self._wait_for(ranks[1:], timeout_s)
            port = free_port(self.address)
            for index, rank in enumerate(ranks[1:], start=1):
                env = layout_env(ranks, self.workers_per_node, index, port)
                self._links[rank].send(_Call(fn, args, env))
            with _environment(layout_env(ranks, self.workers_per_node, 0, port)):
                mine = fn(*args)
            results = [mine]
            for rank in ranks[1:]:
                ok, value = self._links[rank].receive()
                if not ok:
                    raise HeadJobError(f"rank {rank} of this job failed:\n{value}")
                results.append(value)
            return results

    def close(self, straggler_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Tell every worker to stop, and stop listening. A worker that starts after the head's
        function returned is still connecting: wait for it (by default as long as a worker
        tries to connect), so it is told to stop instead of retrying a closed port. One that
        never connects is dead or stuck, and its agent reports why."""
        self._missing_after(range(1, self.world_size), straggler_timeout_s)
        self._closing.set()
        self._thread.join(timeout=2.0)
        with self._joined:
            links = list(self._links.values())
        for link in links:
            try:
                link.send(None)
            except OSError:
                continue  # that worker is gone already; the agent reports why
            finally:
                link.sock.close()


_active: HeadPool | None = None


def active() -> HeadPool | None:
    """The pool of the ``run_on="head"`` job this process is the head of, else ``None``."""
    return _active


# -- a worker's side --------------------------------------------------------------------------


def _connect(key: bytes, address: str, port: int, rank: int) -> _Link:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((address, port), timeout=10.0)
        except OSError as exc:
            last = str(exc)
            time.sleep(_POLL_S)
            continue
        try:
            nonce = _read_exact(sock, _NONCE)
            mine = secrets.token_bytes(_NONCE)
            sock.sendall(struct.pack("!Q", rank) + _proof(key, nonce, rank) + mine)
            answer = _read_exact(sock, _TAG)
        except (OSError, HeadJobError) as exc:
            sock.close()
            last = str(exc)
            time.sleep(_POLL_S)
            continue
        if not hmac.compare_digest(answer, _head_proof(key, nonce, mine, rank)):
            sock.close()
            raise HeadJobError(f"the head at {address}:{port} could not prove it holds the "
                               "job's key; refusing to run its calls")
        sock.settimeout(None)
        return _Link(sock, key, nonce, head=False)
    raise HeadJobError(f"rank {rank} could not reach the head at {address}:{port} within "
                       f"{CONNECT_TIMEOUT_S:.0f}s ({last})")


def _serve(link: _Link) -> None:
    while True:
        try:
            call = link.receive()
        except HeadJobError:
            return  # the head died without a word: its own failure is what the task reports
        if call is None:
            return
        with _environment(call.env):
            try:
                link.send((True, call.fn(*call.args)))
            except Exception:  # the caller's function may raise anything: the head re-raises
                link.send((False, traceback.format_exc()))


def run_head_only(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
                  ) -> Any:
    """Every worker's function in a ``run_on="head"`` task: the head runs ``fn`` with its
    pool open; the others serve the pool and return ``None``. The link key is ``FLOW_HEAD_JOB_KEY``."""
    global _active
    key = _key_from_env()
    address = str(current.main_ip)
    port = int(os.environ["MASTER_PORT"])
    world = int(current.world_size)
    rank = int(current.rank)
    if rank != 0:
        link = _connect(key, address, port, rank)
        with link.sock:
            _serve(link)
        return None
    pool = HeadPool(key, address, port, world, int(current.local_world_size))
    _active = pool
    try:
        return fn(*args, **kwargs)
    finally:
        _active = None
        pool.close()
