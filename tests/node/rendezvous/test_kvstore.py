from __future__ import annotations

import socket
import threading
import time

import pytest

from flow_sdk.errors import RendezvousError
from flow_sdk.node.rendezvous import assign_ranks
from flow_sdk.node.rendezvous.kvstore import KVClient, KVServer
from flow_sdk.node.rendezvous.store import FailureReport, NodeStore, StoreLost
from flow_testing import wait_until
from test_membership import M

SECRET = bytes(range(32))


def test_operations_over_a_real_socket() -> None:
    server = KVServer("127.0.0.1", 0, SECRET)
    client = KVClient("127.0.0.1", server.port, SECRET, connect_timeout_s=5)
    try:
        assert client.get("a") is None
        client.set("a", "1")
        assert client.get("a") == "1"
        assert client.add("n", 2) == 2 and client.add("n", 3) == 5
        assert client.check(["a", "n"]) and not client.check(["a", "zzz"])
        assert client.multi_get(["a", "zzz", "n"]) == ["1", None, "5"]
    finally:
        client.close()
        server.close()


def test_concurrent_adds_are_atomic() -> None:
    server = KVServer("127.0.0.1", 0, SECRET)
    clients = [KVClient("127.0.0.1", server.port, SECRET, connect_timeout_s=5)
               for _ in range(4)]

    def bump(c: KVClient) -> None:
        for _ in range(200):
            c.add("count", 1)

    threads = [threading.Thread(target=bump, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clients[0].get("count") == "800"
    for c in clients:
        c.close()
    server.close()


def _pair(port: int = 0) -> tuple[NodeStore, NodeStore]:
    members = [M("i-a", "127.0.0.1"), M("i-b", "127.0.0.1")]
    leader_m, other_m = assign_ranks(members, "i-a"), assign_ranks(members, "i-b")
    leader = NodeStore.connect(leader_m, port, timeout_s=5, secret=SECRET)
    port = leader._server.port  # type: ignore[union-attr]
    other = NodeStore.connect(other_m, port, timeout_s=5, secret=SECRET)
    return leader, other


def test_barrier_heartbeats_done_and_failure_reports() -> None:
    leader, other = _pair()
    t = threading.Thread(target=other.barrier, args=("start", 5))
    t.start()
    leader.barrier("start", 5)
    t.join()
    leader.heartbeat()
    other.heartbeat()
    other.heartbeat()
    assert leader.heartbeats() == [1, 2]
    other.mark_done()
    assert leader.done_nodes() == {1}
    # a killed worker is timed at the last poll that saw it alive: before the exit it caused
    late = FailureReport(node=0, status="FAILED", message="exit 1", observed_at=2.0, exit_code=1)
    killed = FailureReport(node=1, status="FAILED", message="SIGKILL", observed_at=1.96,
                           signal_name="SIGKILL")
    assert not leader.failed()
    other.report_failure(killed)
    leader.report_failure(late)
    # the flag reaches the leader through its watch thread, which a loaded machine may delay
    wait_until(leader.failed, 5, "the failure flag at the leader")
    root = min(leader.failure_reports(), key=FailureReport.root_cause_key)
    assert root.node == 1  # the earliest failure, whatever its kind
    other.close()
    leader.close()


def test_barrier_timeout_names_missing_node() -> None:
    leader, other = _pair()
    with pytest.raises(RendezvousError, match=r"missing: node 1 \(i-b"):
        leader.barrier("start", 0.3)
    other.close()
    leader.close()


def test_lost_leader_raises_store_lost() -> None:
    leader, other = _pair()
    leader.close()
    with pytest.raises(StoreLost, match="lost contact with the leader"):
        for _ in range(3):
            other.heartbeat()
    other.close()


def test_a_port_another_process_holds_fails_the_leader_at_once_naming_it() -> None:
    members = [M("i-a", "127.0.0.1"), M("i-b", "127.0.0.1")]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(RendezvousError) as raised:
            NodeStore.connect(assign_ranks(members, "i-a"), port, timeout_s=60, secret=SECRET)
    assert time.monotonic() - started < 5
    assert f"could not host the rendezvous store at 127.0.0.1:{port}: " in str(raised.value)
    assert "within" not in str(raised.value)
