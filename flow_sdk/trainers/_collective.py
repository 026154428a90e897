"""XGBoost's collective on a flow task: the tracker on the leader, ranks equal to ours.

Rank 0 starts ``xgboost.tracker.RabitTracker`` on the leader's address (``current.main_ip``)
on a port the OS picks, then answers on ``MASTER_PORT`` (set for every worker in
``distributed_mode="auto"`` and free for the user's collective, since XGBoost training does
not use ``torch.distributed``) with that port. The other ranks ask there, retrying every 0.1 s
until the leader answers, so no rank depends on the order in which the workers start and
nobody leans on XGBoost's own connect retries (2 s, 4 s, 6 s, ... apart). The exchange is a
single line each way; a request must carry the task id, so a stray client gets nothing.

Each worker then joins with ``dmlc_task_id`` = its zero-padded rank and the tracker sorts by
task id, so XGBoost's rank equals ``current.rank`` (checked after joining).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from flow_sdk.trainers._common import TrainerError

_POLL_S = 0.1
_IO_TIMEOUT_S = 5.0
_MAX_LINE = 4096


@dataclass(frozen=True)
class CollectiveConfig:
    """Where this worker is in the XGBoost group and how long bootstrapping may take."""

    rank: int
    world_size: int
    leader_ip: str
    exchange_port: int
    token: str
    timeout_s: float


def _task_ident(rank: int) -> str:
    return f"{rank:08d}"  # the tracker sorts task ids as strings: pad so "10" follows "9"


class _PortServer:
    """Rank 0's side of the exchange: answer ``world_size - 1`` requests with the tracker
    port, on a daemon thread, until served or stopped."""

    def __init__(self, host: str, port: int, token: str, answer: dict[str, Any],
                 clients: int) -> None:
        try:
            self._sock = socket.create_server((host, port))
        except OSError as exc:
            raise TrainerError(f"rank 0 could not listen on {host}:{port} (MASTER_PORT) to "
                               f"hand out the XGBoost tracker's port: {exc}") from exc
        self._sock.settimeout(_POLL_S)
        self._token = token
        self._reply = (json.dumps(answer) + "\n").encode()
        self._left = clients
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="flow-xgb-port-exchange",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with self._sock:
            while self._left > 0 and not self._stop.is_set():
                try:
                    conn, _ = self._sock.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(_IO_TIMEOUT_S)
                    try:
                        request = _read_line(conn)
                        if request == self._token:
                            conn.sendall(self._reply)
                            self._left -= 1
                    except OSError:
                        continue  # a client that went away; it retries or the task fails

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * _POLL_S + _IO_TIMEOUT_S)


def _read_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n") and len(data) < _MAX_LINE:
        chunk = conn.recv(_MAX_LINE)
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", errors="replace").strip()


def fetch_tracker_port(config: CollectiveConfig) -> int:
    """Ask rank 0 for the tracker's port, retrying until it answers or the timeout ends."""
    deadline = time.monotonic() + config.timeout_s
    last: str = "no answer yet"
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((config.leader_ip, config.exchange_port),
                                          timeout=_IO_TIMEOUT_S) as conn:
                conn.sendall((config.token + "\n").encode())
                reply = _read_line(conn)
            if reply:
                port = int(json.loads(reply)["port"])
                return port
            last = "the leader closed the connection without an answer"
        except (OSError, ValueError, KeyError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(_POLL_S)
    raise TrainerError(f"rank {config.rank} got no XGBoost tracker port from rank 0 at "
                       f"{config.leader_ip}:{config.exchange_port} within {config.timeout_s:.0f}s "
                       f"({last}); is rank 0 running?")


@contextmanager
def xgboost_collective(config: CollectiveConfig) -> Iterator[None]:
    """Join the task's XGBoost communication group for the ``with`` block (rank 0 also hosts
    the tracker and waits for it to finish afterwards). Raises ``TrainerError`` when
    XGBoost's rank differs from ``config.rank``."""
    from xgboost import collective
    from xgboost.tracker import RabitTracker

    tracker: RabitTracker | None = None
    server: _PortServer | None = None
    timeout = max(1, int(config.timeout_s))
    if config.rank == 0:
        tracker = RabitTracker(n_workers=config.world_size, host_ip=config.leader_ip, port=0,
                               sortby="task", timeout=timeout)
        tracker.start()
        port = int(tracker.worker_args()["dmlc_tracker_port"])
        server = _PortServer(config.leader_ip, config.exchange_port, config.token,
                             {"port": port}, config.world_size - 1)
    else:
        port = fetch_tracker_port(config)
    try:
        with collective.CommunicatorContext(dmlc_tracker_uri=config.leader_ip,
                                            dmlc_tracker_port=port,
                                            dmlc_task_id=_task_ident(config.rank)):
            got = collective.get_rank(), collective.get_world_size()
            if got != (config.rank, config.world_size):
                raise TrainerError(f"XGBoost assigned rank {got[0]} of {got[1]} to the worker "
                                   f"of rank {config.rank} of {config.world_size}")
            yield
    finally:
        if server is not None:
            server.close()
    if tracker is not None:
        tracker.wait_for(timeout)
