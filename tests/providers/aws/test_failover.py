"""Capacity failover and rollback, with errors injected into moto's EC2 backend as AWS sends
them (InsufficientInstanceCapacity is an HTTP 500), through real boto3 over HTTP."""

from __future__ import annotations

import pytest
from aws_moto_world import AwsWorld, Ec2Faults, Recorder, node_config_of, spec

from flow_sdk.errors import CapacityError, ProviderError
from flow_sdk.wire import BootConfig
from flow_sdk.providers.aws._launch import TRANSIENT_RETRIES, client_token
from flow_sdk.providers.aws._resources import key_path
from flow_sdk.providers.base import LaunchRequest
from flow_sdk.spec import TaskSpec


def request_for(world: AwsWorld, task_id: str, task_spec: TaskSpec) -> LaunchRequest:
    return LaunchRequest(task_id, task_spec,
                         BootConfig(task_id, "aws", world.config(), secret="0" * 64))


def zones(world: AwsWorld, region: str, instance_type: str) -> list[str]:
    """The zones moto offers the type in (every one has a default subnet in moto)."""
    offers = world.client("ec2", region).describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": [instance_type]}])["InstanceTypeOfferings"]
    return sorted(o["Location"] for o in offers)


def leftovers(world: AwsWorld, task_id: str, regions: tuple[str, ...]) -> list[str]:
    """Anything of the task still alive: instances, security groups, key pairs (and key files)."""
    found = []
    for region in regions:
        found += [f"{region} {i}" for i in world.non_terminated(region)]
        ec2 = world.client("ec2", region)
        flt = [{"Name": "tag:flow:task-id", "Values": [task_id]}]
        found += [g["GroupId"] for g in ec2.describe_security_groups(Filters=flt)["SecurityGroups"]]
        found += [k["KeyName"] for k in ec2.describe_key_pairs(Filters=flt)["KeyPairs"]]
        if key_path(task_id, region).exists():
            found.append(str(key_path(task_id, region)))
    return found


BOTH = ("us-east-1", "us-west-2")


def test_failover_goes_zone_then_region_then_type(aws: AwsWorld, ec2_faults: Ec2Faults) -> None:
    # a10g:1 on-demand in [us-east-1, us-west-2]: the catalog orders g5.xlarge (us-east-1,
    # then us-west-2: same price, region order), then g5.2xlarge.
    ec2_faults.capacity(instance_type="g5.xlarge")
    provider = aws.provider(regions=list(BOTH))
    started = provider.launch(request_for(aws, "fo-1", spec(gpu="a10g:1", num_instances=2,
                                                           priority="high")))
    expected = ([("us-east-1", z, "g5.xlarge") for z in zones(aws, "us-east-1", "g5.xlarge")]
                + [("us-west-2", z, "g5.xlarge") for z in zones(aws, "us-west-2", "g5.xlarge")]
                + [("us-east-1", zones(aws, "us-east-1", "g5.2xlarge")[0], "g5.2xlarge")])
    assert ec2_faults.seen == expected
    assert len(started) == 2
    live = [i for i in aws.instances("us-east-1") if i["State"]["Name"] == "running"]
    assert {i["InstanceType"] for i in live} == {"g5.2xlarge"}
    assert {i["Placement"]["AvailabilityZone"] for i in live} == {expected[-1][1]}
    # the failed region keeps nothing of the task: its security group and key pair are gone
    assert leftovers(aws, "fo-1", ("us-west-2",)) == []
    assert [i.instance_id for i in provider.list_instances("fo-1")] == sorted(
        i["InstanceId"] for i in live)
    provider.terminate("fo-1")
    assert leftovers(aws, "fo-1", BOTH) == []


def test_when_every_offer_fails_the_error_lists_every_attempt(
        aws: AwsWorld, ec2_faults: Ec2Faults) -> None:
    ec2_faults.capacity()  # no capacity anywhere
    provider = aws.provider(regions=list(BOTH))
    with pytest.raises(CapacityError) as caught:
        provider.launch(request_for(aws, "fo-2", spec(gpu="a10g:1", priority="high")))
    message = str(caught.value)
    tried = len(ec2_faults.seen)
    assert tried == sum(len(zones(aws, r, t)) for r in BOTH for t in ("g5.xlarge", "g5.2xlarge"))
    assert f"all {tried} attempt(s) failed" in message
    for number, (_region, zone, instance_type) in enumerate(ec2_faults.seen, start=1):
        assert f"#{number} {instance_type} on-demand in {zone} " in message
    assert message.count("InsufficientInstanceCapacity") == tried
    assert "Nothing was left running" in message
    assert leftovers(aws, "fo-2", BOTH) == []


def test_spot_capacity_errors_fall_back_to_on_demand(aws: AwsWorld,
                                                     ec2_faults: Ec2Faults) -> None:
    ec2_faults.capacity(market="spot", code="InsufficientInstanceCapacity")
    provider = aws.provider()
    provider.launch(request_for(aws, "fo-3", spec(gpu="t4:1", priority="med")))
    spot_tries = len(zones(aws, "us-east-1", "g4dn.xlarge"))
    assert len(ec2_faults.seen) == spot_tries + 1
    running = [i for i in aws.instances() if i["State"]["Name"] == "running"]
    assert len(running) == 1 and "InstanceLifecycle" not in running[0]  # on-demand
    provider.terminate("fo-3")


def test_partial_gang_is_terminated_before_the_next_try(aws: AwsWorld,
                                                        ec2_faults: Ec2Faults) -> None:
    first_zone = zones(aws, "us-east-1", "c7i.xlarge")[0]
    ec2_faults.partial(1, zone=first_zone)  # moto starts 1 of the 3 the gang needs
    provider = aws.provider()
    started = provider.launch(request_for(aws, "fo-4", spec(num_instances=3, priority="high")))
    everything = aws.instances()
    assert len(everything) == 4
    stray = [i for i in everything if i["Placement"]["AvailabilityZone"] == first_zone]
    assert len(stray) == 1 and stray[0]["State"]["Name"] == "terminated"
    assert sorted(aws.non_terminated()) == sorted(i.instance_id for i in started)
    # a node sees its own gang only; the client sees the terminated stray too
    node = aws.provider(**node_config_of(provider, started[0].instance_id, "us-east-1"))
    assert [i.instance_id for i in node.list_instances("fo-4")] == [
        i.instance_id for i in started]
    states = {i.instance_id: i.state for i in provider.list_instances("fo-4")}
    assert states[stray[0]["InstanceId"]] == "terminated"
    provider.terminate("fo-4")
    assert aws.non_terminated() == []


def test_lost_responses_are_retried_with_one_client_token_then_rolled_back(
        aws: AwsWorld, ec2_faults: Ec2Faults, recorder: Recorder) -> None:
    first_zone = zones(aws, "us-east-1", "c7i.xlarge")[0]
    ec2_faults.lose_response(zone=first_zone)  # instances start, the answer never arrives
    provider = aws.provider(recorder)
    provider.launch(request_for(aws, "fo-5", spec(num_instances=2, priority="high")))
    tries = TRANSIENT_RETRIES + 1
    tokens = [r["ClientToken"] for r in recorder.run_instances]
    assert tokens[:tries] == [client_token("fo-5", 1)] * tries  # idempotent: same token
    assert tokens[tries:] == [client_token("fo-5", 2)]
    # moto does not honour ClientToken, so every lost try started a gang; all are terminated
    strays = [i for i in aws.instances() if i["Placement"]["AvailabilityZone"] == first_zone]
    assert len(strays) == 2 * tries and {i["State"]["Name"] for i in strays} == {"terminated"}
    assert len(aws.non_terminated()) == 2
    provider.terminate("fo-5")


def test_throttling_is_retried_in_place(aws: AwsWorld, ec2_faults: Ec2Faults,
                                        recorder: Recorder) -> None:
    ec2_faults.transient(times=2)
    provider = aws.provider(recorder)
    provider.launch(request_for(aws, "fo-6", spec(num_instances=2, priority="high")))
    assert len(recorder.run_instances) == 3
    assert len({r["ClientToken"] for r in recorder.run_instances}) == 1
    assert len({(r, z) for r, z, _ in ec2_faults.seen}) == 1  # one zone: no failover
    assert len(aws.non_terminated()) == 2
    provider.terminate("fo-6")


def test_quota_errors_skip_the_rest_of_the_region(aws: AwsWorld, ec2_faults: Ec2Faults) -> None:
    ec2_faults.capacity(region="us-east-1", code="VcpuLimitExceeded", status=400)
    provider = aws.provider(regions=list(BOTH))
    provider.launch(request_for(aws, "fo-7", spec(gpu="a10g:1", priority="high")))
    assert [r for r, _, _ in ec2_faults.seen] == ["us-east-1", "us-west-2"]
    assert len(aws.non_terminated("us-west-2")) == 1
    provider.terminate("fo-7")
    assert leftovers(aws, "fo-7", BOTH) == []


def test_a_non_capacity_error_stops_at_once_and_cleans_up(aws: AwsWorld,
                                                          ec2_faults: Ec2Faults) -> None:
    ec2_faults.capacity(code="InvalidParameterCombination", status=400)
    provider = aws.provider(regions=list(BOTH))
    with pytest.raises(ProviderError, match="InvalidParameterCombination") as caught:
        provider.launch(request_for(aws, "fo-8", spec(gpu="a10g:1", priority="high")))
    assert not isinstance(caught.value, CapacityError)
    assert len(ec2_faults.seen) == 1
    assert leftovers(aws, "fo-8", BOTH) == []


def test_attempts_are_capped(aws: AwsWorld, ec2_faults: Ec2Faults) -> None:
    ec2_faults.capacity()
    provider = aws.provider(max_launch_attempts=3)
    with pytest.raises(CapacityError, match="max_launch_attempts=3"):
        provider.launch(request_for(aws, "fo-9", spec(gpu="a10g:1", priority="high")))
    assert len(ec2_faults.seen) == 3
    assert leftovers(aws, "fo-9", ("us-east-1",)) == []
