"""Discovery (one paged describe_instances), terminate, describe, gc, config and check."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from aws_moto_world import (
    AwsWorld,
    Recorder,
    describe,
    launch_ids,
    node_config_of,
    placement_groups,
    spec,
)

from flow_sdk import wire
from flow_sdk.errors import FlowError, ProviderError
from flow_sdk.wire import LaunchLease, Outcome, TaskRecord
from flow_sdk.providers import get_provider
from flow_sdk.providers.aws import AwsProvider
from flow_sdk.providers.aws._resources import (
    delete_resources,
    key_path,
    tagged_resources,
    tags,
)
from flow_sdk.sim import simulated_address


def end(provider: AwsProvider, task_id: str) -> None:
    provider.store.put_if_absent(wire.outcome_key(task_id), wire.to_json(
        Outcome("SUCCEEDED", "every rank returned", time.time())))


# -- discovery -----------------------------------------------------------------------------


def test_list_instances_is_one_describe_call_sorted_by_id(aws: AwsWorld,
                                                          recorder: Recorder) -> None:
    provider = aws.provider()
    ids = launch_ids(provider, "disc-1", spec(num_instances=5, priority="high"))
    node_config = node_config_of(provider, ids[0], "us-east-1")
    node = aws.provider(recorder, **node_config)  # rebuilt from FLOW_BOOT as an agent does
    found = node.list_instances("disc-1")
    assert recorder.calls == ["ec2.DescribeInstances"]  # one call, no per-peer polling
    assert [i.instance_id for i in found] == sorted(ids)
    raw = {i["InstanceId"]: i for i in aws.instances()}
    assert all(i.address == raw[i.instance_id]["PrivateIpAddress"] for i in found)
    assert {i.state for i in found} == {"running"} and all(i.task_id == "disc-1" for i in found)
    provider.terminate("disc-1")
    assert {i.state for i in provider.list_instances("disc-1")} == {"terminated"}


def test_simulated_addresses_map_onto_loopback(aws: AwsWorld) -> None:
    assert simulated_address("172.31.16.5") == "127.31.16.5"
    assert simulated_address("10.1.2.3") == "127.1.2.3"
    with pytest.raises(ProviderError, match="IPv4"):
        simulated_address("fe80::1")
    provider = aws.sim_provider()
    plain = aws.provider()
    ids = launch_ids(plain, "disc-2", spec(num_instances=2, priority="high"))
    mapped = {i.instance_id: i.address for i in provider.list_instances("disc-2")}
    raw = {i["InstanceId"]: i["PrivateIpAddress"] for i in aws.instances()}
    assert mapped == {i: simulated_address(raw[i]) for i in ids}
    plain.terminate("disc-2")


def test_rendezvous_ports_are_fixed_on_aws_and_free_in_simulation(aws: AwsWorld) -> None:
    assert aws.provider().rendezvous_ports() == (29471, 29500)
    first = aws.sim_provider().rendezvous_ports()
    assert first[0] != first[1] and all(p > 1024 for p in first)


def test_describe_reports_type_zone_market_and_attempt(aws: AwsWorld) -> None:
    provider = aws.provider()
    ids = launch_ids(provider, "desc-1", spec(num_instances=2, priority="low"))
    details = describe(provider, "desc-1")
    assert [d.instance_id for d in details] == sorted(ids)
    assert {(d.instance_type, d.market, d.state, d.attempt) for d in details} == {
        ("c7i.xlarge", "spot", "running", "1")}
    provider.terminate("desc-1")


# -- terminate -----------------------------------------------------------------------------


def test_terminate_is_idempotent_and_removes_every_task_resource(aws: AwsWorld) -> None:
    provider = aws.provider()
    launch_ids(provider, "term-1", spec(gpu="a100:8", num_instances=2, priority="high",
                                        internode_interconnect="efa"))
    assert "flow-term-1" in placement_groups()
    fresh = aws.provider()  # another process (Task.from_id): finds the task from its record
    report = fresh.terminate_task("term-1")
    assert sum(" instance i-" in item for item in report.deleted) == 2
    assert any("placement group flow-term-1" in item for item in report.deleted)
    assert aws.non_terminated() == [] and placement_groups() == {}
    assert not key_path("term-1", "us-east-1").exists()
    again = fresh.terminate_task("term-1")
    assert again.deleted == [] and again.deferred == []


def test_a_node_runtime_that_fails_to_stop_never_keeps_the_resources(
        aws: AwsWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chaos seed 1100's teardown: the simulated runtime's stop raised OSError (a full disk)
    and the task's group, key pair, role and secret were left. They go; the runtime's trouble
    is reported for `flow gc`."""
    provider = aws.provider()
    launch_ids(provider, "term-2", spec(num_instances=1, priority="high"))

    def full_disk(task_id: str, instance_ids: object = None) -> list[int]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(provider.nodes.runtime, "stop", full_disk)
    report = provider.terminate_task("term-2")
    assert any("No space left on device" in item for item in report.deferred)
    assert aws.non_terminated() == []
    ec2 = aws.client("ec2")
    assert "flow-term-2" not in {g["GroupName"] for g in
                                 ec2.describe_security_groups()["SecurityGroups"]}
    assert aws.client("iam").list_roles()["Roles"] == []
    assert not [p for p in aws.client("ssm").describe_parameters()["Parameters"]
                if p["Name"].startswith("/flow-sdk/")]


def test_resources_another_teardown_deleted_meanwhile_count_as_gone(aws: AwsWorld) -> None:
    """Chaos seed 7: two teardowns of one task (a cancel and a waiting caller, or a `flow gc`
    beside a client) found the same group; the one that came second met
    InvalidGroup.NotFound and stopped before the task's role. Now that counts as gone."""
    provider = aws.provider()
    launch_ids(provider, "term-3", spec(gpu="a100:8", num_instances=1, priority="high",
                                        internode_interconnect="efa"))
    ec2 = aws.client("ec2")
    found = tagged_resources(ec2, "term-3", placement_groups=True)
    assert all(found.values())  # a group, a key pair and a placement group
    provider.terminate_task("term-3")  # the other teardown
    assert delete_resources(ec2, "us-east-1", found).deferred == []


# -- gc ------------------------------------------------------------------------------------


def test_gc_reclaims_what_lifecycle_judged_ended_and_no_forgery_reclaims_anything(
        aws: AwsWorld) -> None:
    """The provider reclaims what ``flow_sdk.lifecycle`` judged ended (``ended``, having
    checked each task's seal) and nothing else: it reads nothing in the store to decide a task
    ended, so a forged outcome, a forged lease, a removed or rewritten task record on a live
    task reclaims nothing, and each such task is reported live."""
    provider = aws.provider()
    ended = launch_ids(provider, "gc-ended", spec(num_instances=2, priority="high"))
    forged = {name: launch_ids(provider, name, spec(num_instances=1, priority="high",
                                                    max_run_time_hours=1.0))
              for name in ("gc-outcome", "gc-rolled-back", "gc-stale", "gc-no-record",
                           "gc-age")}
    end(provider, "gc-outcome")
    forge_lease(provider, "gc-rolled-back", LaunchLease("rolled-back", time.time(), 120.0, "x"))
    forge_lease(provider, "gc-stale", LaunchLease("launching", 0.0, 120.0, "x"))
    provider.store.delete_prefix(wire.task_key("gc-no-record"))
    provider.store.put(wire.task_key("gc-age"), wire.to_json(TaskRecord(
        "gc-age", spec(max_run_time_hours=1.0).model_dump(mode="json"), "0" * 64, 0.0,
        29400, 29500)))
    ec2 = aws.client("ec2")
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    foreign = ec2.create_security_group(  # another flow installation's group: never touched
        GroupName="flow-other", Description="x", VpcId=vpc, TagSpecifications=[{
            "ResourceType": "security-group",
            "Tags": tags("gc-other", "s3://someone-else/flow/")}])["GroupId"]

    judged = {"gc-ended": "task ended SUCCEEDED"}  # what lifecycle passes, having checked
    dry = provider.gc(dry_run=True, ended=judged)
    assert sorted(dry.terminated_instances) == sorted(f"us-east-1 instance {i}" for i in ended)
    assert len(aws.non_terminated()) == 7  # dry run: nothing changed

    report = provider.gc(ended=judged)
    assert sorted(report.terminated_instances) == sorted(dry.terminated_instances)
    assert report.reasons == judged
    assert report.live_tasks == sorted(forged)
    live = [i for ids in forged.values() for i in ids]
    assert sorted(aws.non_terminated()) == sorted(live)
    groups = {g["GroupName"] for g in ec2.describe_security_groups()["SecurityGroups"]}
    assert {f"flow-{name}" for name in forged} | {"flow-other"} <= groups
    assert "flow-gc-ended" not in groups
    keys = {k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]}
    assert keys == {f"flow-{name}" for name in forged}
    secrets_left = [p["Name"] for p in aws.client("ssm").describe_parameters()["Parameters"]
                    if p["Name"].startswith("/flow-sdk/")]
    assert sorted(name.rsplit("/", 1)[1] for name in secrets_left) == sorted(forged)
    assert "reclaimed: 2 instance(s)" in str(report)
    assert provider.gc().terminated_instances == []  # without a judgement: nothing
    ec2.delete_security_group(GroupId=foreign)
    for name in forged:
        provider.terminate(name)


def forge_lease(provider: AwsProvider, task_id: str, lease: LaunchLease) -> None:
    """A lease as a store writer without the task's secret writes it: not sealed."""
    provider.store.put(wire.launch_lease_key(task_id), wire.to_json(lease))


# -- config and check ----------------------------------------------------------------------


def test_config_is_json_safe_and_credential_free(aws: AwsWorld) -> None:
    provider = aws.provider()
    config = provider.config()
    assert json.loads(json.dumps(config)) == config
    assert AwsProvider.from_config(config).config() == config
    text = json.dumps(config).lower()
    assert "testing" not in text and "secret" not in text
    with pytest.raises(ProviderError, match="must not hold credentials"):
        AwsProvider.from_config({"aws_secret_access_key": "x"})
    with pytest.raises(ProviderError, match="must not hold credentials"):
        AwsProvider.from_config({"code": {"key": "k", "session_token": "x"}})
    with pytest.raises(ProviderError, match="unknown key"):
        AwsProvider.from_config({"regoin": "us-east-1"})
    with pytest.raises(ProviderError, match="whole internet"):
        AwsProvider.from_config({"ssh_cidr": "0.0.0.0/0"})
    assert isinstance(get_provider("aws", config), AwsProvider)


@pytest.mark.parametrize(("options", "field", "words"), [
    ({"gpu": "h100:3"}, "gpu", "exactly"),
    ({"gpu": "h100:8", "max_price_per_hour": 1.0}, "max_price_per_hour", "raise"),
    ({"gpu": "h100:8", "region": "mars-east-1"}, "region", "not in the AWS instance catalog"),
    ({"gpu": "t4:1", "internode_interconnect": "efa"}, "internode_interconnect", "EFA"),
    ({"volumes": {f"/v{n}": {"name": f"v{n}", "interface": "block"} for n in range(12)}},
     "volumes", "at most 11 block volumes"),
    ({"image": "bad image!"}, "image", "container image reference"),
])
def test_check_names_the_field_and_the_fix(aws: AwsWorld, options: dict[str, Any], field: str,
                                           words: str) -> None:
    problems = aws.provider().check(spec(**options))
    assert [p.field for p in problems] == [field], problems
    assert words in problems[0].message


def test_check_accepts_a_good_spec_and_infiniband_means_efa(aws: AwsWorld) -> None:
    provider = aws.provider()
    assert provider.check(spec(gpu="h100:8", num_instances=4)) == []
    assert provider.check(spec(gpu="h100:8", internode_interconnect="InfiniBand")) == []


def test_launch_without_an_offer_is_a_typed_error(aws: AwsWorld) -> None:
    provider = aws.provider()
    with pytest.raises(FlowError, match="no AWS offer"):
        launch_ids(provider, "none-1", spec(gpu="h100:8", max_price_per_hour=1.0))
    assert aws.non_terminated() == []
