from __future__ import annotations

import socket
import threading


from flow_sdk.errors import RendezvousError
from flow_sdk.node.rendezvous import assign_ranks
from flow_sdk.node.rendezvous.preflight import ProbeListener, Target, probe, run_preflight
from flow_sdk.node.rendezvous.store import NodeStore
from test_membership import M


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_probe_names_the_unreachable_target() -> None:
    listener = ProbeListener("127.0.0.1")
    dead = _closed_port()
    try:
        failures = probe([Target(1, "127.0.0.1", listener.port, "probe port"),
                          Target(2, "127.0.0.1", dead, "probe port")], timeout_s=2)
    finally:
        listener.close()
    assert len(failures) == 1 and f"node 2's probe port at 127.0.0.1:{dead}" in failures[0]


def _nodes(count: int) -> list[NodeStore]:
    members = [M(f"i-{n}", f"127.0.0.{n + 1}") for n in range(count)]
    leader = NodeStore.connect(assign_ranks(members, "i-0"), 0, timeout_s=5, secret=bytes(32))
    port = leader._server.port  # type: ignore[union-attr]
    return [leader] + [NodeStore.connect(assign_ranks(members, f"i-{n}"), port, timeout_s=5,
                                         secret=bytes(32))
                       for n in range(1, count)]


def test_three_nodes_pass_preflight_over_real_sockets() -> None:
    stores = _nodes(3)
    master_port = _closed_port()
    results: dict[int, str] = {}
    threads = [threading.Thread(target=lambda s=s: results.__setitem__(
        s.m.node_rank, run_preflight(s, master_port, 10))) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and "6 node pairs" in results[0]
    for s in stores[::-1]:
        s.close()


def test_master_port_taken_on_the_leader_fails_naming_the_leader() -> None:
    stores = _nodes(2)
    with socket.socket() as squatter:  # something else holds MASTER_PORT on the leader
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        errors: list[BaseException] = []

        def run(s: NodeStore) -> None:
            try:
                run_preflight(s, taken, 3)
            except RendezvousError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert any(f"node 0 (127.0.0.1) cannot listen on MASTER_PORT {taken}" in str(e)
               for e in errors)
    for s in stores[::-1]:
        s.close()
