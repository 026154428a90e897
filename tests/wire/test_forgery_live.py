"""Forged objects in a live task's store are refused before anything of them is unpickled or
run: results and error payloads on the client, the task record and payload on a node."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from flow_testing import agent_pid, process_traces, wait_until
from flow_sdk import FlowApp, payload, wire
from flow_sdk.home import tasksecrets
from flow_sdk.system.procs import pids_with_env
from flow_sdk.wire import signing
from flow_sdk.errors import SignatureError
from flow_sdk.wire import BootConfig, TaskRecord, TaskStatus
from flow_sdk.providers.base import LaunchRequest
from flow_sdk.providers.local import LocalProvider
from flow_sdk.spec import build_task_spec
from flow_sdk.client.records import save_client_record
from flow_sdk.client.task import Task
from flow_sdk.wire import envvars

pytestmark = pytest.mark.slow

app = FlowApp("forgery")


class Evil:
    """Unpickling it creates ``marker``: proof that a forged pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return Path.touch, (self.marker,)


@app.function(num_instances=1)
def answer() -> int:
    return 42


@app.function(num_instances=1)
def boom() -> int:
    raise ValueError("boom")


def test_the_forged_pickle_would_run_if_it_were_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "control"
    payload.loads(payload.dumps(Evil(marker)))
    assert marker.exists()  # the control: the refusals below are what keeps it from running


def test_a_forged_result_is_refused_before_unpickling(tmp_path: Path) -> None:
    task = answer.spawn()
    assert task.result(timeout=120) == 42
    marker = tmp_path / "ran"
    key = wire.result_key(task.task_id, 0)
    forged = payload.dumps(Evil(marker))
    other = signing.secret_from_hex(signing.new_secret())
    for blob in (forged, signing.seal_blob(other, key, forged)):
        task.provider.store.put(key, blob)
        with pytest.raises(SignatureError, match=key) as info:
            Task.from_id(task.task_id).result(timeout=5)
        assert info.value.key == key
    assert not marker.exists()


def test_a_forged_error_payload_is_refused_before_unpickling(tmp_path: Path) -> None:
    task = boom.spawn()
    assert task.wait(timeout=120) is TaskStatus.FAILED
    outcome = task.outcome()
    assert outcome is not None and outcome.has_error_payload
    marker = tmp_path / "ran"
    key = wire.error_key(task.task_id, 0)
    task.provider.store.put(key, payload.dumps(Evil(marker)))
    with pytest.raises(SignatureError, match=key):
        task.result(timeout=5)
    assert not marker.exists()


def _launch_by_hand(provider: LocalProvider, blob: bytes, stored_blob: bytes,
                    rewrite: dict[str, str] | None = None) -> Task:
    """What launch_task does, except that the payload stored is ``stored_blob`` and the
    signed record's fields are then changed by ``rewrite`` (its MAC kept)."""
    spec = build_task_spec(app="forgery", name="answer", provider="local", num_instances=1)
    task_id = f"forged-{time.time_ns()}"
    secret = signing.new_secret()
    tasksecrets.save_task_secret(task_id, secret)
    save_client_record(task_id, provider, {"app": "forgery", "name": "answer"})
    digest = payload.digest(blob)
    provider.store.put(wire.payload_key(digest), stored_blob)
    rdzv, master = provider.rendezvous_ports()
    record = TaskRecord(task_id, spec.model_dump(mode="json"), digest, time.time(), rdzv, master)
    key = wire.task_key(task_id)
    fields = json.loads(signing.seal_record(bytes.fromhex(secret), key, record.__dict__))
    provider.store.put(key, json.dumps({**fields, **(rewrite or {})}).encode())
    boot = BootConfig(task_id, "local", provider.config(), secret=secret)
    provider.launch(LaunchRequest(task_id, spec, boot))
    return Task(task_id, provider)


def _refused(task: Task, marker: Path) -> str:
    assert task.wait(timeout=120) is TaskStatus.FAILED
    outcome = task.outcome()
    assert outcome is not None and "refused to run the task" in outcome.message
    assert not marker.exists()
    return outcome.message


def test_a_rewritten_payload_is_refused_by_the_node(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    blob = payload.pack_call(answer.fn, (), {})
    task = _launch_by_hand(LocalProvider(), blob, payload.pack_call(Path.touch, (marker,), {}))
    message = _refused(task, marker)
    assert wire.payload_key(payload.digest(blob)) in message
    assert "SHA-256 does not match" in message


def test_a_rewritten_task_record_is_refused_by_the_node(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    provider = LocalProvider()
    evil = payload.pack_call(Path.touch, (marker,), {})
    provider.store.put(wire.payload_key(payload.digest(evil)), evil)
    blob = payload.pack_call(answer.fn, (), {})
    task = _launch_by_hand(provider, blob, blob, {"payload_digest": payload.digest(evil)})
    message = _refused(task, marker)
    assert wire.task_key(task.task_id) in message and "MAC does not match" in message


@app.function(num_instances=2, max_restarts=1)
def steady() -> int:
    import time as _time

    from flow_sdk import current
    print("ready", flush=True)
    if current.restart_count == 0:
        _time.sleep(300)  # generation 0 ends when node 1 is lost
    return current.restart_count


def test_a_replacement_node_refuses_a_rewritten_record_or_payload(tmp_path: Path) -> None:
    """Two tasks at once (they share nothing but the machine): in one, the record is
    rewritten (another digest, its MAC kept); in the other, the payload (other bytes under the
    signed digest). Node 1 of each is then lost, and each replacement refuses to run."""
    whats = ("record", "payload")
    tasks = {what: steady.spawn() for what in whats}
    for task in tasks.values():
        wait_until(lambda task=task: sum("ready" in line for line in task.logs()) == 2, 90,
                   "2 ranks ready")
    markers = {what: tmp_path / f"ran-{what}" for what in whats}
    keys, gangs, killed = {}, {}, {}
    for what, task in tasks.items():
        evil = payload.pack_call(Path.touch, (markers[what],), {})
        store = task.provider.store
        if what == "record":  # another digest, the MAC kept
            store.put(wire.payload_key(payload.digest(evil)), evil)
            key = wire.task_key(task.task_id)
            raw = store.get(key)
            assert raw is not None
            store.put(key, json.dumps({**json.loads(raw),
                                       "payload_digest": payload.digest(evil)}).encode())
        else:  # other bytes under the signed digest
            key = wire.payload_key(task.record().payload_digest)
            store.put(key, evil)
        keys[what] = key
    for what, task in tasks.items():
        provider = task.provider
        assert isinstance(provider, LocalProvider)
        lost = next(n.instance_id for n in task.nodes() if n.node == 1)
        gangs[what] = {i.instance_id for i in provider.list_instances(task.task_id)}
        os.kill(agent_pid(provider, task.task_id, lost), signal.SIGKILL)
        killed[what] = time.monotonic()
    for what, task in tasks.items():
        provider = task.provider
        assert isinstance(provider, LocalProvider)
        assert task.wait(timeout=120) is TaskStatus.FAILED
        print(f"rewritten {what}: refused by the replacement, FAILED "
              f"{time.monotonic() - killed[what]:.2f} s after the node was killed")
        outcome = task.outcome()
        assert outcome is not None and "refused to run the task" in outcome.message
        assert keys[what] in outcome.message
        replacement = {i.instance_id for i in provider.list_instances(task.task_id)} - \
            gangs[what]
        assert len(replacement) == 1 and next(iter(replacement)) in outcome.message
    assert not any(marker.exists() for marker in markers.values())


def _hold_until(go: str) -> None:
    """On the nodes: run until the test creates ``go`` (two minutes at most)."""
    import os
    import time as _time

    deadline = _time.monotonic() + 120
    while not os.path.exists(go) and _time.monotonic() < deadline:
        _time.sleep(0.05)


@app.function(num_instances=2, quiet=True)
def holds_still(go: str) -> str:
    print("ready", flush=True)
    _hold_until(go)  # while the test looks at the live nodes' processes
    return "done"


def test_the_secret_stays_with_the_agent_and_its_boot_file_is_gone(tmp_path: Path) -> None:
    """No worker, keeper, sshd or SSH helper of a live local node carries the task's secret,
    the boot file's name or an open boot file; the agent removed the file once read."""
    go = tmp_path / "go"
    task = holds_still.spawn(str(go))
    try:
        wait_until(lambda: sum("ready" in ln for ln in task.logs()) == 2, 90, "2 ranks ready")
        secret = tasksecrets.load_task_secret(task.task_id).hex()
        provider = task.provider
        assert isinstance(provider, LocalProvider)
        records = provider._records(task.task_id)
        agents = {int(r["pid"]) for r in records}
        others = [pid for pid in pids_with_env(envvars.INSTANCE_ID,
                                               [r["instance_id"] for r in records])
                  if pid not in agents]
        assert len(others) >= 4, others  # two workers and two keepers at least
        for pid in others:
            seen = process_traces(pid)
            assert secret not in seen and envvars.BOOT_FILE not in seen, pid
            assert "boot.json" not in seen, pid
        assert not [r for r in records if (Path(r["workdir"]) / "boot.json").exists()]
        go.touch()
        assert task.result(timeout=60) == "done"
    finally:
        if not task.status.is_terminal:
            task.cancel()


@app.function(num_instances=2, quiet=True)
def steady_answer(go: str) -> int:
    print("ready", flush=True)
    _hold_until(go)  # until the attack is over
    return 42


def test_hostile_packets_and_objects_during_a_live_task_leave_it_succeeded(
        tmp_path: Path) -> None:
    """While a 2-node task runs, someone without its secret sends the leader's store a
    deeply nested line and holds idle connections, and writes a forged FAILED outcome whose
    MAC is not ASCII, a junk node record and a junk result key: the task still SUCCEEDS with
    its real results."""
    go = tmp_path / "go"
    task = steady_answer.spawn(str(go))
    wait_until(lambda: sum("ready" in line for line in task.logs()) == 2, 90, "2 ranks ready")
    leader = next(n for n in task.nodes() if n.node == 0)
    port = task.record().rdzv_port
    idle = [socket.create_connection((leader.address, port), timeout=5) for _ in range(50)]
    try:
        with socket.create_connection((leader.address, port), timeout=5) as deep:
            deep.sendall(b"[" * 1000 + b"\n")
            assert deep.recv(1 << 16) and deep.recv(1 << 16) == b""  # hello, then dropped
        forged = json.dumps({"status": "FAILED", "message": "forged", "finished_at": 1.0,
                             "mac": "\u00e9" * 64}, ensure_ascii=False).encode()
        task.provider.store.put(wire.outcome_key(task.task_id), forged)
        task.provider.store.put(f"{wire.nodes_prefix(task.task_id)}000007.json", b"junk")
        # "\u00b2" passes str.isdigit but not int(): a result key no rank writes
        task.provider.store.put(wire.results_prefix(task.task_id) + "\u00b2", b"junk")
        time.sleep(2.0)  # the agents' store watch (every 0.25 s) reads them while it runs
        go.touch()
        assert task.result(timeout=120) == 42
        assert task.results() == [42, 42]
    finally:
        go.touch()
        for sock in idle:
            sock.close()
    assert task.status is TaskStatus.SUCCEEDED
    assert not any("crashed" in line for line in task.logs(source="agent"))
