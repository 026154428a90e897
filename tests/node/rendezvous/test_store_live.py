"""The leader's store under a live 2-node local task: peers without the task's secret change
nothing, malformed records and oversize lines leave agents and server running (one task takes
both), and a frozen leader fails the task within the heartbeat bound."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from flow_testing import agent_pid, wait_until
from flow_sdk import FlowApp, Task, TaskStatus, wire
from flow_sdk.home import tasksecrets
from flow_sdk.node.rendezvous import kvwire
from flow_sdk.node.rendezvous.kvstore import KVClient
from flow_sdk.node.rendezvous.store import FailureReport

pytestmark = pytest.mark.slow

app = FlowApp("store-live")


@app.function(num_instances=2)
def hold(go: str) -> int:
    """Every rank: run until the test creates ``go`` (five minutes at most)."""
    import os
    import time
    from flow_sdk import current
    print("ready", flush=True)
    deadline = time.monotonic() + 300
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    return int(current.rank)


def _leader_store(task: Task) -> tuple[str, int]:
    """The leader's store address, once both nodes run their workers."""
    wait_until(lambda: len(task.nodes()) == 2 and all(n.phase == "running" for n in task.nodes()),
               90, "both nodes to run")
    leader = next(n for n in task.nodes() if n.node == 0)
    return leader.address, task.record().rdzv_port


def _send_unauthenticated(host: str, port: int, data: bytes) -> bool:
    """Send ``data`` without the handshake; True when the server dropped the connection."""
    with socket.create_connection((host, port), timeout=10) as sock:
        reader = sock.makefile("rb")
        assert json.loads(reader.readline())["hello"] == kvwire.VERSION
        try:
            sock.sendall(data)
            return reader.read() == b""
        except (ConnectionResetError, BrokenPipeError):  # dropped mid-send (a line too long)
            return True


def test_forgeries_without_the_secret_malformed_records_and_oversize_lines_change_nothing(
        tmp_path: Path) -> None:
    """One live task takes both: forged failure, done and lost records from a peer without
    the task's secret change nothing (a "lost" report would restart it: none does), and
    malformed records and oversize lines from a peer with it leave agents and server
    running; the task then returns its real results."""
    go = tmp_path / "go"
    task = hold.with_options(max_restarts=1).spawn(str(go))
    try:
        host, port = _leader_store(task)
        # a peer without the secret
        lost = FailureReport(node=1, status="FAILED", message="forged: node 1 lost",
                             observed_at=time.time(), lost=True)
        forgeries = [
            {"op": "set", "key": "g0/fail/report/1", "value": json.dumps(lost.__dict__)},
            {"op": "add", "key": "g0/fail/count", "amount": 1},
            {"op": "set", "key": "g0/done/0", "value": "1"},
            {"op": "set", "key": "g0/done/1", "value": "1"},
        ]
        for request in forgeries:
            line = json.dumps(request).encode() + b"\n"
            assert _send_unauthenticated(host, port, line + line)
            assert _send_unauthenticated(host, port, json.dumps(
                {"auth": "0" * 64, "nonce": "1" * 32}).encode() + b"\n" + line)
        assert _send_unauthenticated(host, port, b"x" * (8 << 20))  # 8 MiB, no newline
        # a peer with the secret, writing malformed records and lines
        secret = tasksecrets.load_task_secret(task.task_id)
        peer = KVClient(host, port, secret, connect_timeout_s=10)
        peer.set("g0/hb/1", "not a counter")
        peer.set("g0/done/1", "maybe")
        peer.set("g0/fail/report/0", "{\"node\": ")
        peer._sock.sendall(b"[1, 2]\n{\"op\": \"add\", \"key\": 3}\n")
        assert [json.loads(peer._reader.readline())["ok"] for _ in range(2)] == [False, False]
        with pytest.raises(OSError):  # the server drops the peer: a reset, or EOF on reading
            peer._sock.sendall(b"z" * (kvwire.MAX_LINE + (1 << 20)))
            peer.get("generation")
        peer.close()
        fresh = KVClient(host, port, secret, connect_timeout_s=10)
        assert fresh.get("generation") == "0"  # the server still serves
        fresh.close()
        time.sleep(3.0)  # the agents' store watch (every 0.25 s) reads all this while it runs
        assert task.status is TaskStatus.RUNNING
    finally:
        go.touch()
    assert task.results(timeout=120) == [0, 1]
    assert task.store.list(wire.restarts_prefix(task.task_id)) == []


def test_a_frozen_leader_fails_the_task_within_the_heartbeat_bound(tmp_path: Path) -> None:
    task = hold.spawn(str(tmp_path / "never"))
    _leader_store(task)
    leader = next(n for n in task.nodes() if n.node == 0)
    pid = agent_pid(task.provider, task.task_id, leader.instance_id)  # type: ignore[arg-type]
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        wait_until(lambda: task.outcome() is not None, 60, "the task to end")
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    print(f"frozen leader found after {elapsed:.1f}s")
    outcome = task.outcome()
    assert outcome is not None and outcome.status == TaskStatus.FAILED.value
    assert "lost contact with the leader" in outcome.message and "node 0" in outcome.message
    assert elapsed < 20  # the bound is 10 s (5 s op timeout + decide window); CI is loaded
    assert task.wait(timeout=60) is TaskStatus.FAILED


def test_a_malformed_failure_report_fails_the_task_cleanly_without_crashing_an_agent(
        tmp_path: Path) -> None:
    task = hold.spawn(str(tmp_path / "never"))
    host, port = _leader_store(task)
    peer = KVClient(host, port, tasksecrets.load_task_secret(task.task_id), connect_timeout_s=10)
    peer.set("g0/fail/report/1", json.dumps({"node": 1, "status": "FAILED"}))  # fields missing
    peer.add("g0/fail/count", 1)
    peer.close()
    assert task.wait(timeout=60) is TaskStatus.FAILED
    outcome = task.outcome()
    assert outcome is not None and "no report survived" in outcome.message
    assert "crashed" not in outcome.message
    assert not any("agent crashed" in line for line in task.logs(source="agent"))
