"""A live head-only job (``run_on="head"``) under attack by someone without the task's secret:
idle connections held on its store's listener from the moment it opens, then seeded random
bytes and store lines thrown at it, and seeded random records written into its store. The job
still SUCCEEDS with its real result, and no agent crashed. (The head job's own listener admits
connections only until every worker has joined, moments after start: the attack on it, idle
connections and seeded handshake frames before the workers join, is in
``tests/node/headjob/test_headjob.py``, where the test decides when the worker joins.)"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from flow_testing import wait_until

from flow_sdk import FlowApp, wire
from flow_sdk.wire import TaskStatus
from flow_sdk.providers.base import ObjectStore

pytestmark = pytest.mark.slow

app = FlowApp("hostile")
SEED = 20261125
IDLE = 3  # connections that never say a word, held for the job's life


def _times_ten(value: int) -> int:
    return value * 10


@app.function(num_instances=2, run_on="head", quiet=True)
def head_call(flag: str) -> list[int]:
    import os
    import time as _time

    from flow_sdk.node import headjob

    print("ready", flush=True)
    deadline = _time.monotonic() + 180
    while not os.path.exists(flag) and _time.monotonic() < deadline:  # the attack is over
        _time.sleep(0.1)
    pool = headjob.active()
    assert pool is not None
    return pool.run(_times_ten, (4,), pool.ranks(), timeout_s=60)


def _hold_idle(address: str, port: int, count: int, held: list[socket.socket],
               stop: threading.Event) -> None:
    """Connect ``count`` times to a listener as soon as it opens and say nothing."""
    while len(held) < count and not stop.is_set():
        try:
            held.append(socket.create_connection((address, port), timeout=1))
        except OSError:
            time.sleep(0.01)


def _junk(rng: random.Random) -> bytes:
    """Random bytes, a random JSON document, deep brackets or a long line."""
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 512))
    if kind == 1:
        return json.dumps({"op": rng.choice(["get", "set", "add", "wait", "time", "x"]),
                           "key": rng.randbytes(8).hex(), "value": rng.random(),
                           "mac": rng.randbytes(32).hex()}).encode()
    if kind == 2:
        return rng.choice([b"[", b"{\"a\":"]) * rng.randrange(100, 5000)
    return b"x" * rng.randrange(10_000, 200_000)


def _throw(address: str, port: int, message: bytes) -> bool:
    """One connection, one message; whether the listener took the connection (a reset once
    connected is the listener refusing the message it read: taken all the same)."""
    try:
        sock = socket.create_connection((address, port), timeout=2)
    except OSError:
        return False  # nothing listens there (any more)
    with sock:
        try:
            sock.settimeout(0.5)
            sock.sendall(message + b"\n")
            sock.recv(1 << 16)
        except TimeoutError:
            pass  # the listener is waiting for more: its deadline will drop it
        except OSError:
            pass  # reset: the listener dropped the message
    return True


def _records(rng: random.Random, store: ObjectStore, task_id: str) -> int:
    """Seeded random objects at keys of the task's own families that hold nothing yet (an
    outcome slot, node records, results past the world, restarts, claims); never an
    overwrite, which no MAC can stop."""
    families: list[Callable[[], str]] = [
        lambda: wire.outcome_key(task_id, rng.randrange(16)),
        lambda: f"{wire.nodes_prefix(task_id)}{rng.randrange(10**6):06d}.json",
        lambda: wire.result_key(task_id, rng.randrange(2, 64)),
        lambda: wire.restart_key(task_id, rng.randrange(1, 9)),
        lambda: wire.membership_key(task_id, rng.randrange(1, 9)),
        lambda: wire.decider_key(task_id, rng.randrange(1, 9)),
    ]
    written = 0
    for _ in range(200):
        key = rng.choice(families)()
        body = rng.choice([rng.randbytes(rng.randrange(1, 300)), json.dumps(
            {"status": "FAILED", "message": "forged", "finished_at": 1.0,
             "mac": rng.choice(["\u00e9" * 64, rng.randbytes(32).hex(), "0" * 63])},
            ensure_ascii=False).encode()])
        written += store.put_if_absent(key, body)
    return written


def test_a_head_job_under_idle_connections_and_seeded_fuzz_succeeds(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    flag = tmp_path / "attack-over"  # the nodes are local processes: they see this folder
    task = head_call.spawn(str(flag))
    record = task.record()
    leader = min(task.provider.list_instances(task.task_id), key=lambda i: i.instance_id)
    held: list[socket.socket] = []
    stop = threading.Event()
    holder = threading.Thread(target=_hold_idle, daemon=True,
                              args=(leader.address, record.rdzv_port, IDLE, held, stop))
    holder.start()
    try:
        wait_until(lambda: any("ready" in line for line in task.logs()), 90, "the head ready")
        holder.join(timeout=30)
        assert len(held) == IDLE  # held all along
        packets = sum(_throw(leader.address, record.rdzv_port, _junk(rng)) for _ in range(60))
        records = _records(rng, task.provider.store, task.task_id)
        flag.touch()
        assert packets and records > 50, (packets, records)
        assert task.result(timeout=120) == [40, 40]
    finally:
        stop.set()
        for sock in held:
            sock.close()
        if not task.status.is_terminal:
            task.cancel()
    assert task.status is TaskStatus.SUCCEEDED
    assert not any("crashed" in line or "Traceback" in line
                   for line in task.logs(source="agent"))
