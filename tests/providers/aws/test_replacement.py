"""Node replacement under max_restarts (issue #8): ``add_instances`` and ``terminate_instances``
called from a node (a provider rebuilt from the config its user-data carries), against moto.

The end-to-end run (a node's agent killed with SIGKILL, replaced, the job completing) is in
test_simulated_cloud.py.
"""

from __future__ import annotations

import base64
import time

import pytest
from aws_moto_world import (
    TEST_SECRET,
    AwsWorld,
    Ec2Faults,
    Recorder,
    Wire,
    launch,
    node_config_of,
    spec,
)

from flow_sdk import wire
from flow_sdk.errors import CapacityError, ProviderError
from flow_sdk.wire import BootConfig, TaskRecord, signing
from flow_sdk.providers.aws import AwsProvider
from flow_sdk.providers.aws._launch import client_token
from flow_sdk.providers.base import Instance, LaunchRequest
from flow_sdk.spec import TaskSpec


def tag_dict(tags: list[dict[str, str]]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in tags}


def node_provider(world: AwsWorld, client: AwsProvider, instance_id: str,
                  recorder: Recorder | None = None) -> AwsProvider:
    """The provider a node's agent builds from FLOW_BOOT (the user-data's config)."""
    return world.provider(recorder, **node_config_of(client, instance_id, "us-east-1"))


def replace(node: AwsProvider, task_id: str, task_spec: TaskSpec, count: int = 1
            ) -> list[Instance]:
    """What the deciding agent calls: add_instances with its own boot config."""
    boot = BootConfig(task_id, "aws", node.config(), secret="0" * 64)
    return node.add_instances(LaunchRequest(task_id, task_spec, boot), count)


def user_data(world: AwsWorld, instance_id: str) -> str:
    value = world.client("ec2").describe_instance_attribute(
        InstanceId=instance_id, Attribute="userData")["UserData"]["Value"]
    return base64.b64decode(value).decode()


def test_a_replacement_is_a_copy_of_a_running_node(aws: AwsWorld, recorder: Recorder,
                                                   ec2_wire: Wire) -> None:
    task_spec = spec(num_instances=2, priority="high")
    client = aws.provider()
    gang = launch(client, "rep-1", task_spec)
    node = node_provider(aws, client, gang[0].instance_id, recorder)
    [new] = replace(node, "rep-1", task_spec)

    # from the node it takes: one describe (the gang to copy) and one RunInstances; no IAM,
    # SSM, security group or key pair calls (it reuses the gang's)
    assert recorder.calls == ["ec2.DescribeInstances", "ec2.RunInstances"]
    [sent] = recorder.run_instances
    assert (sent["MinCount"], sent["MaxCount"]) == (1, 1)
    [_gang_wire, wire] = ec2_wire.run_instances
    assert (wire["MinCount"], wire["MaxCount"]) == ("1", "1")  # as it reached moto
    raw = {i["InstanceId"]: i for i in aws.instances()}
    old, rep = raw[gang[0].instance_id], raw[new.instance_id]
    for key in ("InstanceType", "ImageId", "SubnetId", "KeyName", "SecurityGroups"):
        assert rep[key] == old[key], key
    assert rep["Placement"]["AvailabilityZone"] == old["Placement"]["AvailabilityZone"]
    assert rep["IamInstanceProfile"]["Arn"] == old["IamInstanceProfile"]["Arn"]
    assert sent["IamInstanceProfile"] == {"Arn": old["IamInstanceProfile"]["Arn"]}
    assert rep["MetadataOptions"]["HttpTokens"] == "required"  # IMDSv2 only, like the gang
    assert sent["InstanceInitiatedShutdownBehavior"] == "terminate"
    # the gang's tags (task, store, node role, the gang's attempt, market, price) + its own
    replacement = tag_dict(rep["Tags"])["flow:replacement"]
    assert tag_dict(rep["Tags"]) == {**tag_dict(old["Tags"]), "flow:replacement": replacement}
    assert tag_dict(rep["Tags"])["flow:role"] == "node"
    assert sent["ClientToken"] not in {client_token("rep-1", 1), old["ClientToken"]}
    assert user_data(aws, new.instance_id) == user_data(aws, old["InstanceId"])
    assert (new.market, new.usd_per_hour, new.instance_type, new.zone) == (
        gang[0].market, gang[0].usd_per_hour, gang[0].instance_type, gang[0].zone)
    # the running nodes discover it (it carries their attempt tag)
    assert len(node.list_instances("rep-1")) == 3
    client.terminate("rep-1")
    assert aws.non_terminated() == []


def test_replacements_try_the_gang_zone_then_the_other_market_then_other_zones(
        aws: AwsWorld, ec2_faults: Ec2Faults) -> None:
    # spot gang (med, cap above on-demand): replacements may also be on-demand
    task_spec = spec(num_instances=2, priority="med", max_price_per_hour=0.3)
    client = aws.provider()
    gang = launch(client, "rep-2", task_spec)
    gang_ids = {i.instance_id for i in gang}
    zone = gang[0].zone
    assert zone is not None and {i.market for i in gang} == {"spot"}
    node = node_provider(aws, client, gang[0].instance_id)

    ec2_faults.capacity(market="spot", zone=zone)
    ec2_faults.seen.clear()
    [first] = replace(node, "rep-2", task_spec)
    assert ec2_faults.seen == [("us-east-1", zone, "c7i.xlarge")] * 2  # spot, then on-demand
    assert (first.market, first.usd_per_hour, first.zone) == ("on-demand", 0.1785, zone)

    ec2_faults.capacity(zone=zone)  # now nothing at all in the gang's zone
    ec2_faults.partial(1, times=1)  # and the first try elsewhere starts 1 of the 2 asked for
    ec2_faults.seen.clear()
    second = replace(node, "rep-2", task_spec, count=2)
    tried = [z for _region, z, _type in ec2_faults.seen]
    assert tried[:2] == [zone, zone] and tried[2] != zone
    assert {i.zone for i in second} == {tried[-1]} and len(second) == 2
    assert len(tried) == 4  # the partial try was rolled back, the next one succeeded

    alive = set(aws.non_terminated())
    assert gang_ids | {first.instance_id} | {i.instance_id for i in second} == alive

    ec2_faults.capacity()  # no capacity anywhere: a typed error listing every try
    with pytest.raises(CapacityError, match="replacement node") as caught:
        replace(node, "rep-2", task_spec)
    assert "the running nodes were not touched" in str(caught.value)
    assert set(aws.non_terminated()) == alive  # rollbacks never touched the running nodes
    client.terminate("rep-2")


def test_efa_replacements_stay_in_the_placement_group_and_zone(
        aws: AwsWorld, recorder: Recorder, ec2_faults: Ec2Faults) -> None:
    task_spec = spec(gpu="a100:8", num_instances=2, internode_interconnect="efa",
                     priority="high")
    client = aws.provider()
    gang = launch(client, "rep-efa", task_spec)
    node = node_provider(aws, client, gang[0].instance_id, recorder)
    replace(node, "rep-efa", task_spec)
    [sent] = recorder.run_instances
    assert sent["Placement"] == {"AvailabilityZone": gang[0].zone,
                                 "GroupName": "flow-rep-efa"}
    assert [n["InterfaceType"] for n in sent["NetworkInterfaces"]] == ["efa"] * 4
    ec2_faults.capacity(zone=gang[0].zone)
    ec2_faults.seen.clear()
    with pytest.raises(CapacityError):
        replace(node, "rep-efa", task_spec)
    assert len(ec2_faults.seen) == 1  # no other zone, no other market (priority high)
    client.terminate("rep-efa")


def test_a_replacement_gets_what_is_left_of_the_runtime_cap(aws: AwsWorld,
                                                             recorder: Recorder) -> None:
    task_spec = spec(num_instances=2, priority="high", max_run_time_hours=2.0)
    client = aws.provider()
    gang = launch(client, "rep-cap", task_spec, created_at=time.time() - 3600)
    node = node_provider(aws, client, gang[0].instance_id, recorder)
    [new] = replace(node, "rep-cap", task_spec)
    assert "FLOW_SHUTDOWN_MINUTES=130\n" in user_data(aws, gang[0].instance_id)
    assert "FLOW_SHUTDOWN_MINUTES=70\n" in user_data(aws, new.instance_id)  # 1 h left + grace

    past = TaskRecord("rep-cap", task_spec.model_dump(mode="json"), "0" * 64,
                      time.time() - 3 * 3600, 29400, 29500)
    client.store.put(wire.task_key("rep-cap"), wire.to_json(past))  # unsealed: a forgery
    assert len(replace(node, "rep-cap", task_spec)) == 1  # the whole cap: it ends nothing
    sealed = signing.SignedStore(client.store, bytes.fromhex(TEST_SECRET))
    sealed.put_record(wire.task_key("rep-cap"), past)  # past its cap
    recorder.run_instances.clear()
    with pytest.raises(ProviderError, match="past its max_run_time_hours"):
        replace(node, "rep-cap", task_spec)
    assert recorder.run_instances == []
    client.terminate("rep-cap")


def test_terminate_instances_stops_only_the_named_nodes_of_the_task(aws: AwsWorld) -> None:
    client = aws.provider()
    ours = launch(client, "term-a", spec(num_instances=3, priority="high"))
    theirs = launch(client, "term-b", spec(num_instances=1, priority="high"))
    node = node_provider(aws, client, ours[0].instance_id)
    victim = ours[1].instance_id
    node.terminate_instances("term-a", [victim, theirs[0].instance_id, "i-0123456789abcdef0"])
    node.terminate_instances("term-a", [victim])  # idempotent
    node.terminate_instances("term-a", [])
    states = {i["InstanceId"]: i["State"]["Name"] for i in aws.instances()}
    assert states[victim] == "terminated"
    assert [states[i.instance_id] for i in ours if i.instance_id != victim] == ["running"] * 2
    assert states[theirs[0].instance_id] == "running"  # another task's node is never touched
    client.terminate("term-a")
    client.terminate("term-b")


def test_add_instances_refuses_a_task_with_nothing_to_copy(aws: AwsWorld) -> None:
    task_spec = spec(priority="high")
    provider = aws.provider()
    boot = BootConfig("none-1", "aws", provider.config(), secret="0" * 64)
    with pytest.raises(ProviderError, match="no running node to copy"):
        provider.add_instances(LaunchRequest("none-1", task_spec, boot), 1)
    with pytest.raises(ProviderError, match="at least 1"):
        provider.add_instances(LaunchRequest("none-1", task_spec, boot), 0)


def test_a_replacement_takes_the_gangs_profile_when_no_running_node_reports_it(
        aws: AwsWorld) -> None:
    """A gang is launched with one instance profile, but an EC2 API may report the
    association on some of its instances only (moto does, on a request's first). When no
    running node reports it (the lost node did), a replacement still runs with the task's
    own profile."""
    task_spec = spec(num_instances=3, priority="high", max_restarts=1)
    client = aws.provider()
    gang = launch(client, "rep-profile", task_spec)
    ec2 = aws.client("ec2")
    raw = {i["InstanceId"]: i for i in aws.instances()}
    [arn] = {raw[i.instance_id]["IamInstanceProfile"]["Arn"] for i in gang
             if raw[i.instance_id].get("IamInstanceProfile")}
    for assoc in ec2.describe_iam_instance_profile_associations()["IamInstanceProfileAssociations"]:
        ec2.disassociate_iam_instance_profile(AssociationId=assoc["AssociationId"])
    assert not any(i.get("IamInstanceProfile") for i in aws.instances())
    client.terminate_instances("rep-profile", [gang[0].instance_id])
    [new] = replace(node_provider(aws, client, gang[1].instance_id), "rep-profile", task_spec)
    added = {i["InstanceId"]: i for i in aws.instances()}[new.instance_id]
    assert added["IamInstanceProfile"]["Arn"] == arn
    client.terminate("rep-profile")
