"""A client interrupted in the middle of a launch with failover, on the simulated cloud (a moto
server over HTTP on 127.0.0.1, with capacity errors injected into its EC2 backend).

The client is a real process that spawns a 2-node EFA task through ``FlowApp``: its first two
attempts hit InsufficientInstanceCapacity, and EC2 carries out the third but holds its answer.
Ctrl-C (SIGINT, sent by PID) then rolls the launch back: 0 instances, security groups, key
pairs and placement groups are left, even when EC2 does not list the held gang by tag yet
(found by its ClientToken). A client killed with SIGKILL cannot roll back; ``flow gc`` reclaims
what it left once its launch lease goes stale.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers" / "aws"))

from aws_moto_world import (  # noqa: E402
    REGIONS,
    AwsWorld,
    Ec2Faults,
    faulty_run_instances,
    fresh_world,
    moto_gaps,
)
from flow_testing import moto_server, processes_with_env  # noqa: E402
from moto.ec2.models.instances import InstanceBackend  # noqa: E402

from flow_sdk import wire  # noqa: E402
from flow_sdk.wire import LaunchLease, Outcome  # noqa: E402
from flow_sdk.providers.aws._resources import keys_dir  # noqa: E402

pytestmark = pytest.mark.slow

LEASE_TTL_S = 2.0  # the client's launch lease (120 s by default), short for the test
CLIENT = textwrap.dedent("""
    import json, sys
    from flow_sdk import FlowApp
    from flow_sdk.providers.aws import _lease

    _lease.TTL_S, _lease.RENEW_S = float(sys.argv[2]), float(sys.argv[2]) / 4
    app = FlowApp("interrupted", provider="aws", provider_config=json.loads(sys.argv[1]))

    @app.function(gpu="h100:8", num_instances=2, internode_interconnect="efa", priority="high")
    def train() -> int:
        return 1

    print(train.spawn().task_id, flush=True)
""")


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server() as url, moto_gaps():
        yield url


@pytest.fixture()
def aws(moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AwsWorld:
    return fresh_world(moto_url, tmp_path, monkeypatch)


@pytest.fixture()
def ec2_faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[Ec2Faults]:
    faults = Ec2Faults()
    monkeypatch.setattr(InstanceBackend, "run_instances", faulty_run_instances(faults))
    yield faults
    faults.release.set()  # a held answer goes out, so the server's thread ends


def leftovers(aws: AwsWorld) -> list[str]:
    """Everything a launch creates that is still there, in every test region."""
    found = [item for region in REGIONS for item in aws.launch_leftovers(region)]
    if keys_dir().is_dir():
        found += [f"key file {p.name}" for p in keys_dir().iterdir()]
    return found


def start_client(aws: AwsWorld, tmp_path: Path, flow_home: Path) -> subprocess.Popen[str]:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    return subprocess.Popen(
        [sys.executable, str(script), json.dumps(aws.config()), str(LEASE_TTL_S)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "FLOW_HOME": str(flow_home)})


def mid_failover(aws: AwsWorld, ec2_faults: Ec2Faults, client: subprocess.Popen[str]) -> str:
    """Wait until EC2 holds the answer to the client's third attempt; the task's id."""
    if not ec2_faults.holding.wait(180):
        client.kill()
        raise AssertionError(f"the launch never reached its third attempt: "
                             f"{client.communicate()[1][-2000:]}")
    assert len(ec2_faults.seen) == 3 and len(ec2_faults.held) == 2
    tasks = aws.provider().store.list("tasks/")
    return tasks[0].split("/")[1]


def stop(client: subprocess.Popen[str]) -> str:
    try:
        return client.communicate(timeout=60)[1]
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


@pytest.mark.parametrize("listed", [True, False], ids=["listed-by-tag", "not-listed-yet"])
def test_sigint_mid_failover_leaves_nothing(aws: AwsWorld, ec2_faults: Ec2Faults,
                                            tmp_path: Path, flow_home: Path, fault_record,
                                            listed: bool) -> None:
    ec2_faults.capacity(times=2)
    ec2_faults.hold(untagged=not listed)
    client = start_client(aws, tmp_path, flow_home)
    task_id = mid_failover(aws, ec2_faults, client)
    assert aws.non_terminated() != [] and leftovers(aws) != []  # what the rollback must remove
    started = time.monotonic()
    client.send_signal(signal.SIGINT)
    stderr = stop(client)
    elapsed = time.monotonic() - started
    assert client.returncode == -signal.SIGINT, stderr[-2000:]
    assert "KeyboardInterrupt" in stderr
    assert leftovers(aws) == []
    assert sorted(i["InstanceId"] for i in aws.instances()
                  if i["State"]["Name"] == "terminated") >= sorted(ec2_faults.held)
    store = aws.provider().store
    raw_lease = store.get(wire.launch_lease_key(task_id))
    assert raw_lease is not None and LaunchLease.from_json(raw_lease).state == "rolled-back"
    raw_outcome = store.get(wire.outcome_key(task_id))
    assert raw_outcome is not None
    outcome = Outcome.from_json(raw_outcome)
    assert outcome.status == "CANCELLED" and "KeyboardInterrupt" in outcome.message
    left = len(leftovers(aws)) + len(processes_with_env("FLOW_HOME", str(flow_home)))
    how = "listed by tag" if listed else "not yet listed by tag: found by ClientToken"
    fault_record(f"client Ctrl-C (SIGINT) mid-failover on the simulated cloud, 2-node EFA "
                 f"gang held by EC2 ({how})", elapsed, left, "none")


def test_sigkill_mid_failover_is_reclaimed_by_flow_gc(aws: AwsWorld, ec2_faults: Ec2Faults,
                                                      tmp_path: Path, flow_home: Path,
                                                      fault_record) -> None:
    ec2_faults.capacity(times=2)
    ec2_faults.hold()
    client = start_client(aws, tmp_path, flow_home)
    task_id = mid_failover(aws, ec2_faults, client)
    client.send_signal(signal.SIGKILL)
    stop(client)
    started = time.monotonic()
    ec2_faults.release.set()
    left_behind = leftovers(aws)
    kinds = {item.split(" ")[1] for item in left_behind if item.startswith("us-east-1")}
    assert kinds == {"instance", "security", "key", "placement"}, left_behind
    store = aws.provider().store

    def lease() -> LaunchLease:
        raw = store.get(wire.launch_lease_key(task_id))
        assert raw is not None
        return LaunchLease.from_json(raw)

    assert lease().state == "launching"
    while not lease().stale(time.time()):
        time.sleep(0.2)
    gc = subprocess.run([sys.executable, "-c", "from flow_sdk.cli import main; main()", "gc"],
                        capture_output=True, text=True, timeout=120,
                        env={**os.environ, "FLOW_HOME": str(flow_home)})
    elapsed = time.monotonic() - started
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert "launch was cut short" in gc.stdout, gc.stdout
    assert leftovers(aws) == []
    left = len(leftovers(aws)) + len(processes_with_env("FLOW_HOME", str(flow_home)))
    fault_record(f"client SIGKILLed mid-failover, then `flow gc` once its launch lease is stale "
                 f"(lease {LEASE_TTL_S:g} s here, 120 s by default)", elapsed, left, "none")
