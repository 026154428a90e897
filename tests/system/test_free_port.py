"""``procs.free_port``: a port a server binds later, drawn where the kernel hands out none."""

from __future__ import annotations

import socket

import pytest

from flow_sdk.system import procs


def test_a_free_port_is_below_the_kernels_own_range_and_bindable() -> None:
    ephemeral = procs.ephemeral_ports()
    ports = {procs.free_port("127.0.0.1") for _ in range(20)}
    assert all(10000 <= port < ephemeral.start for port in ports)
    assert len(ports) > 1  # drawn, not a fixed port
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_taken_on_every_address_is_never_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port held on 0.0.0.0 is taken on every loopback address too: the draw skips it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("0.0.0.0", 0))
        taken = held.getsockname()[1]
        draws = iter([taken, taken])  # the held port twice, then real draws
        real = procs.random.Random.randrange
        monkeypatch.setattr(procs, "ephemeral_ports", lambda: range(65535, 65536))
        monkeypatch.setattr(procs.random.Random, "randrange",
                            lambda self, a, b: next(draws, None) or real(self, a, b))
        port = procs.free_port("127.45.0.7")
        assert next(draws, None) is None  # the held port was drawn, and passed over
    assert port != taken


def test_with_no_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procs, "ephemeral_ports", lambda: range(10010, 65536))
    assert 10010 <= procs.free_port() <= 65535
