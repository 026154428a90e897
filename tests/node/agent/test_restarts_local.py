"""max_restarts: a failed generation re-rendezvouses; lost nodes are replaced."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from flow_testing import agent_pid, processes_with_env, wait_until
from flow_sdk import FlowApp, TaskStatus, wire
from flow_sdk.wire import signing
from flow_sdk.providers.local import LocalProvider
from flow_sdk.node.agent import worker

pytestmark = pytest.mark.slow

app = FlowApp("restarts")


@app.function(num_instances=2, workers_per_node=1, max_restarts=1)  # a rank per node
def resilient() -> dict:
    import time

    import torch
    import torch.distributed as dist

    from flow_sdk import current

    dist.init_process_group("gloo")
    value = torch.ones(1)
    dist.all_reduce(value)
    if current.restart_count == 0:
        print(f"rank {current.rank} ready", flush=True)
        time.sleep(300)  # generation 0 never finishes: a node dies first
    dist.destroy_process_group()
    return {"restart": current.restart_count, "sum": float(value.item()),
            "node": current.node_index}


def test_killed_node_is_replaced_and_the_job_completes(flow_home: Path) -> None:
    task = resilient.spawn()
    provider = task.provider
    assert isinstance(provider, LocalProvider)
    wait_until(lambda: sum("ready" in ln for ln in task.logs()) == 2, 90, "both ranks ready")
    first = {n.node: n.instance_id for n in task.nodes()}
    os.kill(agent_pid(provider, task.task_id, first[1]), signal.SIGKILL)
    results = task.results(timeout=120)
    assert [r["restart"] for r in results] == [1, 1]
    assert all(r["sum"] == 2.0 for r in results)  # both ranks joined the new generation
    instances = {i.instance_id for i in provider.list_instances(task.task_id)}
    assert first[1] in instances and len(instances) == 3  # the lost node plus its replacement
    assert first[1] not in {n.instance_id for n in task.nodes()}
    agent_lines = task.logs(source="agent")
    assert any("restart 1 of 1" in ln for ln in agent_lines)
    restart = task.store.get_record(wire.restart_key(task.task_id, 1))
    assert restart is not None and json.loads(restart)["reason"]["label"] == "infra"
    # the survivor and the replacement took generation 1's gang from the decider's record
    assert sum("membership of generation 1 from its record" in ln for ln in agent_lines) == 2
    assert not any("asking the provider" in ln for ln in agent_lines)
    wait_until(lambda: not processes_with_env("FLOW_HOME", str(flow_home)), 10, "no processes")


@app.function(num_instances=2, max_restarts=2, restart_on="any")
def flaky() -> int:
    from flow_sdk import current
    if current.node_index == 1 and current.restart_count < 2:
        raise RuntimeError(f"transient failure {current.restart_count}")
    return current.restart_count


def test_worker_failures_restart_in_place_until_success() -> None:
    task = flaky.spawn()
    assert task.results(timeout=120) == [2, 2]
    assert task.status is TaskStatus.SUCCEEDED
    agent_lines = task.logs(source="agent")
    for gen in range(3):  # restarts in place: each generation's record names the same nodes
        assert sum(f"membership of generation {gen} from its record" in ln
                   for ln in agent_lines) == 2


def test_restarts_exhausted_fails_with_the_last_cause() -> None:
    with pytest.raises(RuntimeError, match="transient failure 1"):
        flaky.with_options(max_restarts=1).remote()


@app.function(num_instances=2, max_restarts=1, restart_on="any")
def fails_once(flag: str) -> int:
    import os
    import time

    from flow_sdk import current
    if current.node_index == 1 and current.restart_count == 0:
        until = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < until:
            time.sleep(0.05)  # the forged claims are in the store before this fails
        raise RuntimeError("first generation fails")
    return current.restart_count


def test_forged_decider_claims_cannot_stop_the_restart(tmp_path: Path) -> None:
    flag = tmp_path / "forged"
    task = fails_once.spawn(str(flag))
    started = time.monotonic()
    for slot in range(2):  # unsigned, and signed with another task's secret
        key = wire.decider_key(task.task_id, 0, slot)
        other = signing.SignedStore(task.provider.store, bytes(32))
        if slot:
            other.put_record(key, {"instance_id": "i-forger"})
        else:
            task.provider.store.put(key, b"i-forger")
    flag.touch()
    assert task.results(timeout=120) == [1, 1]
    elapsed = time.monotonic() - started
    print(f"forged decider claims: restarted and SUCCEEDED {elapsed:.2f} s after spawn")
    assert elapsed < 30  # DECISION_WAIT_S: nobody waited for a forger
    agent_lines = task.logs(source="agent")
    assert sum("ignored a forged record" in ln and "decider" in ln for ln in agent_lines) >= 2
    assert any("restart 1 of 1" in ln for ln in agent_lines)


@app.function(num_instances=2, max_restarts=2)
def divides_by_zero() -> float:
    return 1 / 0


def test_a_user_exception_is_not_restarted_and_is_labelled_user() -> None:
    task = divides_by_zero.spawn()
    with pytest.raises(ZeroDivisionError) as raised:
        task.result(timeout=120)
    outcome = task.final_outcome()
    assert outcome is not None and outcome.label == "user"
    assert "not restarted: a user failure" in outcome.message
    assert task.store.get_record(wire.restart_key(task.task_id, 1)) is None  # never restarted
    assert any("[user failure]" in note for note in raised.value.__notes__)
    shown = subprocess.run(["flow", "status", task.task_id], capture_output=True, text=True,
                           timeout=60)
    assert any(line.split()[:2] == ["failure", "user"] for line in shown.stdout.splitlines())


@pytest.mark.parametrize(("exc", "label"), [
    (OSError(errno.ENOSPC, "No space left on device"), "infra"), (MemoryError(), "infra"),
    (OSError(errno.EACCES, "Permission denied"), "user"), (ZeroDivisionError(), "user")])
def test_a_full_disk_or_exhausted_memory_is_labelled_infra(exc: BaseException,
                                                            label: str) -> None:
    assert worker.label_of(exc) == label
