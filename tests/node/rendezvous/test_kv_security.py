"""The store's trust and limits, over real sockets: only holders of the secret are served,
limits drop a peer without stopping the server, and waits are answered by the server."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flow_sdk.errors import RendezvousError
from flow_sdk.node.rendezvous import kvwire
from flow_sdk.node.rendezvous.kvstore import KVClient, KVServer, StoreRefused
from flow_sdk.node.rendezvous.store import FailureReport, parse_report

SECRET = bytes(range(32))
WRONG = bytes(32)


def _raw(port: int) -> tuple[socket.socket, dict[str, str]]:
    """A plain socket to the store and the server's hello."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    hello = json.loads(sock.makefile("rb").readline())
    return sock, hello


def _closed_by_server(sock: socket.socket) -> bool:
    """True when the server closed the connection (EOF or reset) instead of answering."""
    try:
        data = sock.recv(1 << 16)
    except ConnectionResetError:
        return True
    return data == b""


@pytest.fixture()
def server() -> KVServer:
    srv = KVServer("127.0.0.1", 0, SECRET, initial={"g0/fail/count": "0"})
    yield srv
    srv.close()


def test_the_hello_carries_a_fresh_nonce_and_never_the_secret(server: KVServer) -> None:
    a, hello_a = _raw(server.port)
    b, hello_b = _raw(server.port)
    assert hello_a["hello"] == kvwire.VERSION and hello_a["nonce"] != hello_b["nonce"]
    assert SECRET.hex() not in json.dumps(hello_a)
    a.close()
    b.close()


@pytest.mark.parametrize("first_line", [
    b'{"op": "set", "key": "g0/fail/count", "value": "9"}\n',  # no handshake at all
    b'{"auth": "00", "nonce": "' + b"a" * 32 + b'"}\n',  # a wrong proof
    b"not json\n",
    b"[" * 1000 + b"\n",  # deep nesting: Python's decoder would raise RecursionError
])
def test_a_connection_without_the_secret_is_dropped_and_changes_nothing(
        server: KVServer, first_line: bytes) -> None:
    sock, _ = _raw(server.port)
    sock.sendall(first_line + b'{"op": "set", "key": "g0/done/0", "value": "1"}\n')
    assert _closed_by_server(sock)
    sock.close()
    client = KVClient("127.0.0.1", server.port, SECRET, connect_timeout_s=5)
    assert client.multi_get(["g0/fail/count", "g0/done/0"]) == ["0", None]
    assert server.dropped == 1
    client.close()


def test_a_proof_keyed_with_the_secret_itself_is_dropped(server: KVServer) -> None:
    """The handshake proves the store's handshake key, derived from the secret: a client that
    keys its proof with the secret itself (the record MAC of the old scheme) is not served."""
    sock, hello = _raw(server.port)
    mine = kvwire.new_nonce()
    raw_keyed = hmac.new(SECRET, b"kv-client\0" + f"{hello['nonce']}:{mine}".encode(),
                         hashlib.sha256).hexdigest()
    sock.sendall(json.dumps({"auth": raw_keyed, "nonce": mine}).encode() + b"\n"
                 + b'{"op": "set", "key": "g0/done/0", "value": "1"}\n')
    assert _closed_by_server(sock)
    sock.close()
    client = KVClient("127.0.0.1", server.port, SECRET, connect_timeout_s=5)
    assert client.get("g0/done/0") is None and server.dropped == 1
    client.close()


def test_a_client_with_the_wrong_secret_is_refused(server: KVServer) -> None:
    with pytest.raises((RendezvousError, ConnectionError)):
        KVClient("127.0.0.1", server.port, WRONG, connect_timeout_s=5)


def test_a_client_refuses_a_server_without_the_secret() -> None:
    impostor = KVServer("127.0.0.1", 0, WRONG)
    try:
        with pytest.raises((RendezvousError, ConnectionError)):
            KVClient("127.0.0.1", impostor.port, SECRET, connect_timeout_s=5)
    finally:
        impostor.close()


def test_oversize_lines_drop_the_peer_and_the_server_keeps_serving(server: KVServer) -> None:
    sock, _ = _raw(server.port)  # unauthenticated: 1 KiB before the handshake
    sock.sendall(b"x" * (kvwire.MAX_HELLO_LINE + 10))
    assert _closed_by_server(sock)
    sock.close()
    big = KVClient("127.0.0.1", server.port, SECRET, connect_timeout_s=5)
    with pytest.raises(OSError):  # authenticated, a line over the cap and no newline
        big._sock.sendall(b"y" * (kvwire.MAX_LINE + (1 << 16)))
        big.get("anything")
    big.close()
    client = KVClient("127.0.0.1", server.port, SECRET, connect_timeout_s=5)
    client.set("k", "v")
    assert client.get("k") == "v" and server.dropped == 2
    client.close()


def test_malformed_requests_get_an_error_and_the_connection_lives_on(server: KVServer) -> None:
    client = KVClient("127.0.0.1", server.port, SECRET, connect_timeout_s=5)
    for request in ({"op": "set", "key": 5, "value": "x"}, {"op": "drop_all"},
                    {"op": "add", "key": "n", "amount": "1"}, {"op": "multi_get", "keys": "k"},
                    {"op": "set", "key": "k", "value": "x" * (kvwire.MAX_VALUE + 1)},
                    {"op": "wait", "key": "n", "at_least": 1, "timeout_s": 1e9}):
        with pytest.raises(StoreRefused):
            client._call(request)
    client._sock.sendall(b"{broken\n")
    assert json.loads(client._reader.readline())["ok"] is False
    client._sock.sendall(b'{"op": "get", "key": ' + b"[" * 5000 + b"\n")
    assert json.loads(client._reader.readline())["ok"] is False
    client.set("n", "garbage")
    assert client.add("n", 2) == 2  # a malformed counter restarts from 0
    client.close()


def test_a_wait_is_answered_when_the_counter_moves(server: KVServer) -> None:
    waiter = KVClient("127.0.0.1", server.port, SECRET, connect_timeout_s=5)
    writer = KVClient("127.0.0.1", server.port, SECRET, connect_timeout_s=5)
    got: list[int] = []
    thread = threading.Thread(target=lambda: got.append(waiter.wait("c", 2, 30)))
    thread.start()
    writer.add("c", 1)
    writer.add("c", 1)
    thread.join(10)
    assert got == [2]
    started = time.monotonic()
    assert waiter.wait("never", 1, 0.2) == 0  # times out on the server with the value now
    assert time.monotonic() - started < 5
    waiter.close()
    writer.close()


def test_reports_are_validated_before_use() -> None:
    good = FailureReport(node=1, status="FAILED", message="m", observed_at=1.0, exit_code=3)
    raw = json.dumps(good.__dict__ | {"log_tail": []})
    assert parse_report(raw, 2) == good
    for bad in ("{", "[]", raw.replace('"node": 1', '"node": 7'),
                raw.replace('"FAILED"', '"SUCCEEDED"'), raw.replace('"lost": false', '"lost": 1'),
                raw.replace('"exit_code": 3', '"exit_code": "3"'), json.dumps({"node": 1})):
        assert parse_report(bad, 2) is None, bad


def test_requests_queued_behind_a_wait_are_served_after_it(server: KVServer) -> None:
    waiter = KVClient("127.0.0.1", server.port, SECRET, connect_timeout_s=5)
    writer = KVClient("127.0.0.1", server.port, SECRET, connect_timeout_s=5)
    waiter._sock.sendall(b'{"op": "wait", "key": "c", "at_least": 1, "timeout_s": 30}\n'
                         b'{"op": "get", "key": "c"}\n')
    writer.add("c", 1)
    replies = [json.loads(waiter._reader.readline()) for _ in range(2)]
    assert replies == [{"ok": True, "value": 1}, {"ok": True, "value": "1"}]
    waiter.close()
    writer.close()


SERVE_WITH_FEW_DESCRIPTORS = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
from flow_sdk.node.rendezvous.kvstore import KVServer
server = KVServer("127.0.0.1", 0, bytes(range(32)))
print(server.port, flush=True)
time.sleep(60)
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_idle_connections_past_the_descriptor_limit_leave_the_server_idle() -> None:
    """300 idle connections to a server that has 128 descriptors: it pauses accepting
    instead of spinning, drops them at the handshake deadline, then serves again."""
    proc = subprocess.Popen([sys.executable, "-c", SERVE_WITH_FEW_DESCRIPTORS],
                            stdout=subprocess.PIPE, text=True)
    held: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        for _ in range(300):
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                break  # the backlog is full: the attacker holds what it got
        before = _cpu_seconds(proc.pid)
        time.sleep(2.0)
        used = _cpu_seconds(proc.pid) - before
        assert used < 0.3, f"the server used {used:.2f}s of CPU in 2s while held"
        for sock in held:
            sock.close()
        client = KVClient("127.0.0.1", port, SECRET, connect_timeout_s=kvwire.HANDSHAKE_S + 5)
        client.set("k", "v")
        assert client.get("k") == "v"
        client.close()
    finally:
        for sock in held:
            sock.close()
        proc.kill()
        proc.wait()
