"""A launch that ends early for any reason rolls back what it started, and ``flow gc`` tells a
live launch from one whose client died. In-process, through real boto3 over HTTP to moto; the
client-process versions (SIGINT, SIGKILL) are in tests/faults/test_launch_interrupt.py."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from aws_moto_world import TEST_SECRET, AwsWorld, Ec2Faults, launch, placement_groups, spec

from flow_sdk import lifecycle, wire
from flow_sdk.home import tasksecrets
from flow_sdk._config import flow_home
from flow_sdk.errors import CapacityError
from flow_sdk.wire import LaunchLease, signing
from flow_sdk.providers.aws import AwsProvider, _gang
from flow_sdk.providers.aws._interrupts import LaunchInterrupted
from flow_sdk.providers.aws._resources import keys_dir

EFA_GANG = {"gpu": "h100:8", "num_instances": 2, "internode_interconnect": "efa",
            "priority": "high"}


def leftovers(aws: AwsWorld) -> list[str]:
    ec2 = aws.client("ec2")
    found = [f"instance {i}" for i in aws.non_terminated()]
    found += [f"security group {g['GroupName']}"
              for g in ec2.describe_security_groups()["SecurityGroups"]
              if g["GroupName"] != "default"]
    found += [f"key pair {k['KeyName']}" for k in ec2.describe_key_pairs()["KeyPairs"]]
    found += [f"placement group {name}" for name in placement_groups()]
    if keys_dir().is_dir():
        found += [f"key file {p.name}" for p in keys_dir().iterdir()]
    return found


def lease_of(provider: AwsProvider, task_id: str) -> LaunchLease:
    raw = provider.store.get(wire.launch_lease_key(task_id))
    assert raw is not None
    return LaunchLease.from_json(raw)


def fail_start(provider: AwsProvider, monkeypatch: pytest.MonkeyPatch, action: Any) -> None:
    """Make the node runtime's start (after EC2 answered with the gang) run ``action``."""
    def start(boot: Any, nodes: Any) -> None:
        action()

    monkeypatch.setattr(provider.runtime, "start", start)


def test_ctrl_c_after_ec2_answered_terminates_the_gang_by_the_ids_it_returned(
        aws: AwsWorld, ec2_faults: Ec2Faults, monkeypatch: pytest.MonkeyPatch) -> None:
    ec2_faults.release.set()  # answered at once, but the gang is not listed by tag yet
    ec2_faults.hold(untagged=True)
    provider = aws.provider()

    def interrupt() -> None:
        raise KeyboardInterrupt

    fail_start(provider, monkeypatch, interrupt)
    with pytest.raises(KeyboardInterrupt):
        launch(provider, "int-1", spec(**EFA_GANG))
    assert len(ec2_faults.held) == 2
    assert leftovers(aws) == []
    assert lease_of(provider, "int-1").state == "rolled-back"


def test_sigterm_during_a_launch_rolls_it_back_then_ends_it(
        aws: AwsWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    provider = aws.provider()
    fail_start(provider, monkeypatch, lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with pytest.raises(LaunchInterrupted, match="SIGTERM"):
        launch(provider, "int-2", spec(**EFA_GANG))
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored
    assert leftovers(aws) == []


def test_a_second_ctrl_c_waits_for_the_rollback(aws: AwsWorld, ec2_faults: Ec2Faults,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capfd: pytest.CaptureFixture[str]) -> None:
    ec2_faults.capacity()  # every offer fails: the launch rolls back, then raises
    real_delete = _gang.delete_resources
    interrupted: list[int] = []

    def delete_resources(ec2: Any, region: str, found: Any) -> Any:
        interrupted.append(1)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the groups are being deleted
        return real_delete(ec2, region, found)

    monkeypatch.setattr(_gang, "delete_resources", delete_resources)
    provider = aws.provider(max_launch_attempts=2)
    with pytest.raises(KeyboardInterrupt):
        launch(provider, "int-3", spec(**EFA_GANG))
    assert interrupted and leftovers(aws) == []
    assert "still removing what the interrupted launch started" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_any_error_after_ec2_answered_rolls_the_launch_back(
        aws: AwsWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    provider = aws.provider()

    def bug() -> None:
        raise TypeError("a bug in the launch")

    fail_start(provider, monkeypatch, bug)
    with pytest.raises(TypeError, match="a bug in the launch"):
        launch(provider, "int-4", spec(**EFA_GANG))
    assert leftovers(aws) == []


def test_a_launch_that_succeeds_closes_its_lease(aws: AwsWorld) -> None:
    provider = aws.provider()
    launch(provider, "int-5", spec(num_instances=2, priority="high"))
    assert lease_of(provider, "int-5").state == "launched"
    assert provider.gc().terminated_instances == []  # a launched, live task is kept
    provider.terminate("int-5")


def test_gc_reclaims_a_launch_whose_client_stopped_renewing_its_lease(aws: AwsWorld) -> None:
    provider = aws.provider()
    ids = {}
    for task_id in ("lease-live", "lease-dead", "lease-future", "lease-rolled"):
        ids[task_id] = [i.instance_id for i in launch(provider, task_id,
                                                      spec(num_instances=1, priority="high"))]
        tasksecrets.save_task_secret(task_id, TEST_SECRET)
    # Each launch above ended and noted so on this machine; make three of them launches whose
    # client was killed before it could (no note), and one that was rolled back.
    for task_id in ("lease-live", "lease-dead", "lease-future"):
        (flow_home() / "secrets" / f"{task_id}.launch").unlink()
    tasksecrets.save_launch_end("lease-rolled", "rolled-back")
    sealed = signing.SignedStore(provider.store, bytes.fromhex(TEST_SECRET))
    now = time.time()
    for task_id, state, renewed_at in (
            ("lease-live", "launching", now - 30),  # renewed 30 s ago: live
            ("lease-dead", "launching", now - 300),  # 120 s lease, 300 s ago
            ("lease-future", "launching", now + 7200),  # dated into the future
            ("lease-rolled", "rolled-back", now)):
        sealed.put_record(wire.launch_lease_key(task_id),
                          LaunchLease(state, renewed_at, 120.0, "laptop:4242"))
    report = lifecycle.collect(provider, known=set(ids))
    assert report.live_tasks == ["lease-live"]
    assert "launch was cut short" in report.reasons["lease-dead"]
    assert "laptop:4242" in report.reasons["lease-dead"]
    assert "launch was cut short" in report.reasons["lease-future"]
    assert report.reasons["lease-rolled"] == ("its launch ended without a gang and was "
                                              "rolled back")
    assert sorted(aws.non_terminated()) == sorted(ids["lease-live"])
    groups = {g["GroupName"] for g in aws.client("ec2").describe_security_groups()[
        "SecurityGroups"]}
    assert groups == {"default", "flow-lease-live"}
    provider.store.put(wire.launch_lease_key("lease-live"), b"{\"state\": ")  # malformed
    assert lifecycle.collect(provider, known=set(ids)).live_tasks == ["lease-live"]
    provider.terminate("lease-live")


def test_a_programs_own_signal_handler_is_kept_and_gets_the_held_signal(
        aws: AwsWorld, ec2_faults: Ec2Faults, monkeypatch: pytest.MonkeyPatch) -> None:
    ec2_faults.capacity()
    noted: list[int] = []
    real_delete = _gang.delete_resources

    def delete_resources(ec2: Any, region: str, found: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)  # e.g. `flow run --detach` notes it and goes on
        assert noted == []  # held until the rollback is done
        return real_delete(ec2, region, found)

    monkeypatch.setattr(_gang, "delete_resources", delete_resources)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: noted.append(signum))
    try:
        with pytest.raises(CapacityError):
            launch(aws.provider(max_launch_attempts=2), "int-6", spec(**EFA_GANG))
        assert noted == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert leftovers(aws) == []
