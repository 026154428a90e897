"""The head's pool over real loopback sockets: authenticated joins, calls in rank order, a
worker's failure raised at the head, and torchrun's variables for a call's layout."""

from __future__ import annotations

import os
import random
import secrets
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from flow_sdk import payload
from flow_sdk.node import headjob
from flow_sdk.node.agent import worker
from flow_sdk.errors import ValidationError
from flow_sdk.system.procs import free_port
from flow_sdk.spec import build_task_spec
from flow_sdk.wire import envvars

KEY = secrets.token_bytes(32)


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """The ranks here are threads of this process (on a node each is a process of its own),
    and a call sets torchrun's variables in the one ``os.environ`` while it runs: calls on
    two threads at once can leave one's RANK behind, which would then make a later test in
    this runner a rank other than 0. Put the environment back as it was."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _serve_as(port: int, rank: int) -> None:
    """A worker of rank ``rank``: joins the head at ``port`` and serves its calls."""
    link = headjob._connect(KEY, "127.0.0.1", port, rank)
    with link.sock:
        headjob._serve(link)


@contextmanager
def _pool(world_size: int) -> Iterator[headjob.HeadPool]:
    port = free_port()
    pool = headjob.HeadPool(KEY, "127.0.0.1", port, world_size, workers_per_node=1)
    threads = [threading.Thread(target=_serve_as, args=(port, rank), daemon=True)
               for rank in range(1, world_size)]
    for thread in threads:
        thread.start()
    try:
        yield pool
    finally:
        pool.close()
        for thread in threads:
            thread.join(timeout=10)
    assert not any(t.is_alive() for t in threads)  # close() stops every worker


def _times_ten(value: int) -> int:
    return value * 10


def test_a_call_runs_on_the_chosen_ranks_in_rank_order() -> None:
    with _pool(3) as pool:
        assert pool.ranks() == [0, 1, 2] and pool.ranks(2) == [0, 1]
        assert pool.run(_times_ten, (4,), [0, 1, 2]) == [40, 40, 40]
        assert pool.run(_times_ten, (5,), [0, 2]) == [50, 50]  # several calls, a subset


def test_a_workers_exception_is_raised_at_the_head() -> None:
    with _pool(2) as pool:
        with pytest.raises(headjob.HeadJobError, match="worker failure 7"):
            pool.run(_fail_on_workers, (7,), [0, 1])


def _fail_on_workers(value: int) -> int:
    if threading.current_thread() is not threading.main_thread():  # the head runs in the test's
        raise RuntimeError(f"worker failure {value}")  # thread, its workers in threads of theirs
    return value


def test_a_client_without_the_key_is_turned_away() -> None:
    port = free_port()
    pool = headjob.HeadPool(KEY, "127.0.0.1", port, 2, workers_per_node=1)
    try:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            nonce = headjob._read_exact(sock, 16)
            wrong = headjob._proof(secrets.token_bytes(32), nonce, 1)
            sock.sendall(struct.pack("!Q", 1) + wrong + secrets.token_bytes(16))
            assert sock.recv(1) == b""  # closed without a word
        with pytest.raises(headjob.HeadJobError, match=r"rank\(s\) \[1\]"):
            pool.run(_times_ten, (1,), [0, 1], timeout_s=0.5)
    finally:
        pool.close(straggler_timeout_s=0)


def test_a_worker_that_connects_after_the_heads_function_returned_is_told_to_stop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded machine starts rank 1 late: the head's function has returned already. The
    head waits for it and tells it to stop; before, rank 1 retried a closed port."""
    monkeypatch.setattr(headjob, "CONNECT_TIMEOUT_S", 5.0)  # how long rank 1 keeps trying
    port = free_port()
    pool = headjob.HeadPool(KEY, "127.0.0.1", port, 2, workers_per_node=1)
    closer = threading.Thread(target=pool.close, daemon=True)
    closer.start()
    time.sleep(0.5)
    assert closer.is_alive()  # still listening, for rank 1
    link = headjob._connect(KEY, "127.0.0.1", port, 1)
    with link.sock:
        headjob._serve(link)  # returns: told to stop
    closer.join(timeout=10)
    assert not closer.is_alive()


def test_layout_env_gives_each_participant_torchruns_variables() -> None:
    ranks = [0, 1, 2, 3]  # 2 nodes x 2 workers
    env = headjob.layout_env(ranks, 2, 3, 29511)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (
        "3", "4", "1", "2")
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["MASTER_PORT"]) == ("1", "2", "29511")
    first_workers = headjob.layout_env([0, 2], 2, 1, 1)  # local rank 0 of each node
    assert (first_workers["RANK"], first_workers["LOCAL_RANK"],
            first_workers["LOCAL_WORLD_SIZE"], first_workers["FLOW_NODE_RANK"]) == (
        "1", "0", "1", "1")


def test_run_on_head_needs_auto_mode_and_the_worker_routes_through_the_head_job(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="run_on"):
        build_task_spec(app="a", name="n", run_on="head", distributed_mode="manual")
    with pytest.raises(ValidationError, match="run_on"):
        build_task_spec(app="a", name="n", run_on="head-node")
    call = payload.Call(_times_ten, (1,), {}, {})
    monkeypatch.delenv(envvars.HEAD_JOB_KEY, raising=False)
    assert worker._run(call) == 10  # no link key: the plain call
    monkeypatch.setenv(envvars.HEAD_JOB_KEY, "zz" * 32)  # a link key: through the head job
    with pytest.raises(headjob.HeadJobError, match="64-hex-digit"):
        worker._run(call)


def test_the_link_key_comes_from_the_task_secret_never_from_the_payload(
        monkeypatch: pytest.MonkeyPatch) -> None:
    secret = secrets.token_bytes(32)
    key = headjob.link_key(secret)
    assert len(key) == 64 and key == headjob.link_key(secret) != headjob.link_key(KEY)
    assert key != secret.hex()  # derived: a worker's environment never holds the secret
    monkeypatch.delenv(envvars.HEAD_JOB_KEY, raising=False)
    with pytest.raises(headjob.HeadJobError, match=envvars.HEAD_JOB_KEY):
        headjob.run_head_only(_times_ten, (1,), {})
    monkeypatch.setenv(envvars.HEAD_JOB_KEY, "zz" * 32)
    with pytest.raises(headjob.HeadJobError, match="64-hex-digit"):
        headjob.run_head_only(_times_ten, (1,), {})


def test_idle_connections_to_the_head_do_not_keep_the_workers_out() -> None:
    """Connections that never finish their handshake: the workers are admitted beside them
    at once, and the idle ones are closed at the handshake deadline."""
    port = free_port()
    pool = headjob.HeadPool(KEY, "127.0.0.1", port, 3, workers_per_node=1)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    threads = []
    try:
        for rank in (1, 2):
            threads.append(threading.Thread(target=_serve_as, args=(port, rank), daemon=True))
            threads[-1].start()
        started = time.monotonic()
        assert pool.run(_times_ten, (3,), [0, 1, 2], timeout_s=30) == [30, 30, 30]
        assert time.monotonic() - started < headjob.HANDSHAKE_S  # not after the idle ones
        idle[0].settimeout(headjob.HANDSHAKE_S + 5)
        assert idle[0].recv(64) and idle[0].recv(64) == b""  # the nonce, then closed
    finally:
        for sock in idle:
            sock.close()
        pool.close()
        for thread in threads:
            thread.join(timeout=10)


def _answer_without_the_key(rng: random.Random) -> bytes:
    """A seeded handshake answer by someone without the key: a rank (in range or not) with a
    random proof, a proof made for another nonce, or random bytes of any length."""
    kind = rng.randrange(3)
    rank = struct.pack("!Q", rng.choice([0, 1, 2, 2**63]))
    if kind == 0:
        return rank + rng.randbytes(32 + 16)
    if kind == 1:  # a real worker's proof, replayed from another handshake
        return rank + headjob._proof(KEY, rng.randbytes(16), 1) + rng.randbytes(16)
    return rng.randbytes(rng.randrange(1, 200))


def test_seeded_handshake_frames_before_the_workers_join_are_turned_away() -> None:
    """While the head waits for its workers, frames without the key are closed without an
    answer and admit no one; the worker that joins afterwards runs the call."""
    rng = random.Random(20261128)
    port = free_port()
    pool = headjob.HeadPool(KEY, "127.0.0.1", port, 2, workers_per_node=1)
    try:
        for _ in range(40):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.settimeout(headjob.HANDSHAKE_S + 5)
                headjob._read_exact(sock, 16)  # the head's nonce, which the frame ignores
                frame = _answer_without_the_key(rng)
                sock.sendall(frame)
                if len(frame) < 8 + 32 + 16:
                    sock.shutdown(socket.SHUT_WR)  # too short: the head sees the end
                try:
                    assert sock.recv(64) == b""  # closed, no head proof
                except ConnectionResetError:
                    pass  # closed with bytes of ours unread: as good as
        assert not pool._links  # no one was admitted
        serving = threading.Thread(target=_serve_as, args=(port, 1), daemon=True)
        serving.start()
        assert pool.run(_times_ten, (5,), [0, 1], timeout_s=30) == [50, 50]
    finally:
        pool.close()
    serving.join(timeout=10)
    assert not serving.is_alive()  # close() stopped it


def test_a_worker_refuses_a_head_without_the_key() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def impostor() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(secrets.token_bytes(16))
                headjob._read_exact(conn, 8 + 32 + 16)
                conn.sendall(secrets.token_bytes(32))  # a proof it cannot make
                time.sleep(1)

        thread = threading.Thread(target=impostor, daemon=True)
        thread.start()
        with pytest.raises(headjob.HeadJobError, match="could not prove it holds the job's key"):
            headjob._connect(KEY, "127.0.0.1", port, 1)
        thread.join(timeout=5)
