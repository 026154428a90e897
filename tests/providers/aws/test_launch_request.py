"""The launch request: built right (unit), and recorded right by moto (over HTTP).

moto ignores MaxCount, placement groups, EFA interface types and spot MaxPrice; those are
asserted on the request the provider built and sent (recorded through botocore events), and
everything moto does record is asserted on what it recorded.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import stat
import subprocess
from typing import Any

import pytest
from aws_moto_world import (
    NODE_CODE,
    AwsWorld,
    Recorder,
    boot_of,
    placement_groups,
    spec,
)

from flow_sdk.catalog import find_offers
from flow_sdk.errors import ProviderError
from flow_sdk.wire import BootConfig
from flow_sdk.providers.aws import _userdata
from flow_sdk.providers.aws._launch import (
    AttemptPlan,
    client_token,
    market_options,
    run_instances_request,
)
from flow_sdk.providers.aws._iam import TASK_POLICY_NAME, role_name, task_policy
from flow_sdk.providers.aws._resources import key_path
from flow_sdk.providers.base import LaunchRequest
from flow_sdk.spec import TaskSpec


def request_for(world: AwsWorld, task_id: str, task_spec: TaskSpec, **config: Any
                ) -> LaunchRequest:
    boot = BootConfig(task_id, "aws", world.config(**config), secret="0" * 64)
    return LaunchRequest(task_id, task_spec, boot)


def tag_dict(tags: list[dict[str, str]]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in tags}


def plan_for(task_spec: TaskSpec, *, market: str, efa: bool, gpu_offer: str) -> AttemptPlan:
    offer = next(o for o in find_offers(task_spec.gpu, regions=["us-east-1"], markets=[market])
                 if o.instance_type == gpu_offer)
    return AttemptPlan(
        task_id="train-1", spec=task_spec, offer=offer, zone="us-east-1b",
        subnet_id="subnet-1", security_group="sg-1", ami_id="ami-1", root_device="/dev/sda1",
        key_name="flow-train-1", instance_profile="flow-sdk-node-x", user_data="#!/bin/bash\n",
        attempt=3, store_tag="s3://b/flow/", efa=efa,
        placement_group="flow-train-1" if efa else None)


# -- the request, unit ---------------------------------------------------------------------


def test_efa_spot_request_carries_every_field() -> None:
    task_spec = spec(gpu="h100:8", num_instances=4, internode_interconnect="efa",
                     priority="low", max_price_per_hour=40.0)
    req = run_instances_request(plan_for(task_spec, market="spot", efa=True,
                                         gpu_offer="p5.48xlarge"))
    assert req["InstanceType"] == "p5.48xlarge"
    assert (req["MinCount"], req["MaxCount"]) == (4, 4)
    assert req["ClientToken"] == client_token("train-1", 3) and len(req["ClientToken"]) <= 64
    assert req["ClientToken"] != client_token("train-1", 4)
    assert req["MetadataOptions"]["HttpTokens"] == "required"  # IMDSv2 only
    assert req["IamInstanceProfile"] == {"Name": "flow-sdk-node-x"}
    assert req["KeyName"] == "flow-train-1"
    assert req["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert req["Placement"] == {"AvailabilityZone": "us-east-1b", "GroupName": "flow-train-1"}
    assert req["InstanceMarketOptions"] == {"MarketType": "spot", "SpotOptions": {
        "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate",
        "MaxPrice": "40.0000"}}
    nics = req["NetworkInterfaces"]
    assert len(nics) == 32  # p5.48xlarge: one EFA interface per network card
    assert {n["InterfaceType"] for n in nics} == {"efa"}
    assert [n["NetworkCardIndex"] for n in nics] == list(range(32))
    assert nics[0]["DeviceIndex"] == 0 and {n["DeviceIndex"] for n in nics[1:]} == {1}
    assert all(n["SubnetId"] == "subnet-1" and n["Groups"] == ["sg-1"] for n in nics)
    assert "SubnetId" not in req and "SecurityGroupIds" not in req  # they live on the NICs
    instance_tags = tag_dict(req["TagSpecifications"][0]["Tags"])
    assert req["TagSpecifications"][0]["ResourceType"] == "instance"
    assert instance_tags == {"flow:task-id": "train-1", "flow:role": "node", "flow:attempt": "3",
                             "flow:market": "spot", "flow:store": "s3://b/flow/",
                             "flow:usd-per-hour": "31.4600", "Name": "flow-train-1"}


def test_on_demand_ethernet_request_with_min_instances() -> None:
    task_spec = spec(gpu="a10g:1", num_instances=8, min_instances=6, priority="high")
    req = run_instances_request(plan_for(task_spec, market="on-demand", efa=False,
                                         gpu_offer="g5.xlarge"))
    assert (req["MinCount"], req["MaxCount"]) == (6, 8)
    assert req["SubnetId"] == "subnet-1" and req["SecurityGroupIds"] == ["sg-1"]
    assert "NetworkInterfaces" not in req and "InstanceMarketOptions" not in req
    assert req["Placement"] == {"AvailabilityZone": "us-east-1b"}
    assert req["BlockDeviceMappings"][0]["DeviceName"] == "/dev/sda1"


@pytest.mark.parametrize(("image", "hops"), [(None, 1), ("nvcr.io/nvidia/pytorch:24.05-py3", 2)])
def test_imds_tokens_reach_a_container_only_when_the_task_runs_in_its_image(
        image: str | None, hops: int) -> None:
    task_spec = spec(gpu="a10g:1", priority="high", image=image)
    req = run_instances_request(plan_for(task_spec, market="on-demand", efa=False,
                                         gpu_offer="g5.xlarge"))
    assert req["MetadataOptions"] == {"HttpTokens": "required", "HttpEndpoint": "enabled",
                                      "HttpPutResponseHopLimit": hops}


def test_spot_without_a_cap_leaves_max_price_to_aws() -> None:
    task_spec = spec(gpu="t4:1", priority="low")
    offer = find_offers(task_spec.gpu, regions=["us-east-1"], markets=["spot"])[0]
    options = market_options(offer, task_spec)
    assert options is not None and "MaxPrice" not in options["SpotOptions"]


# -- the user-data -------------------------------------------------------------------------


def _render(**overrides: Any) -> str:
    inputs: dict[str, Any] = {
        "boot": BootConfig("t-1", "aws", {"region": "us-east-1"}),
        "code": NODE_CODE, "secret_parameter": "/flow-sdk/0123456789abcdef/t-1",
        "image": None, "gpus": False, "interconnect": "ethernet", "mount_paths": (),
        "max_run_time_hours": None}
    inputs.update(overrides)
    script: str = _userdata.render(_userdata.BootstrapInputs(**inputs))
    return script


VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "image-gpu-efa": {"image": "nvcr.io/nvidia/pytorch:24.05-py3", "gpus": True,
                      "interconnect": "efa", "max_run_time_hours": 12.5},
    "mounts-with-odd-names": {"image": "python:3.11", "mount_paths": ("/shared/my data",
                                                                      "/shared/it's")},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_user_data_passes_bash_n_and_fits_ec2_limit(variant: str) -> None:
    script = _render(**VARIANTS[variant])
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True,
                           check=False)
    assert check.returncode == 0, check.stderr
    assert len(script.encode()) < _userdata.USER_DATA_LIMIT
    assert "@@" not in script


def test_user_data_runs_the_agent_in_the_image_with_host_network_gpus_efa_and_volumes() -> None:
    script = _render(**VARIANTS["image-gpu-efa"])
    for needle in ("--network host", "--ipc host", "--gpus all", "/dev/infiniband/uverbs",
                   "default_env FI_PROVIDER efa", "default_env NCCL_SOCKET_IFNAME",
                   "exec python3 -m flow_sdk.providers.aws._bootlog", "latest/api/token",
                   "FLOW_SHUTDOWN_MINUTES=760", "shutdown -h now"):
        assert needle in script, needle
    assert "FLOW_GPUS=1" in script and "FLOW_INTERCONNECT=efa" in script


def test_values_are_inert_shell_words() -> None:
    hostile = "$(touch /tmp/flow-pwned)`id`'; echo x"
    code = dataclasses.replace(NODE_CODE, url=hostile)
    script = _render(code=code, mount_paths=("/shared/a b", "/shared/$(id)"))
    # only the assignments, nothing that runs (the script itself would power the node off)
    assignments = script[script.index("FLOW_BOOT_JSON="):script.index("FLOW_WORKDIR=")]
    out = subprocess.run(["bash", "-c", assignments
                          + 'printf "%s\\n" "$FLOW_CODE_URL" "${FLOW_MOUNT_PATHS[@]}"'],
                         capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [hostile, "/shared/a b", "/shared/$(id)"]


def test_oversized_user_data_is_refused_with_the_fix() -> None:
    with pytest.raises(ProviderError, match="16384-byte user-data limit"):
        _render(image="x" * 17000)


def test_boot_config_round_trips_through_the_user_data_as_one_shell_word() -> None:
    node_config = {"region": "us-east-1", "bucket": "b", "prefix": "it's $HOME `id` \\ \"q\"",
                   "launch": {"task_id": "t-1", "region": "us-east-1", "attempt": 2}}
    boot = BootConfig("t-1", "aws", {"region": "us-east-1"}).with_provider_config(node_config)
    script = _render(boot=boot)
    assert boot_of(script) == boot


def test_user_data_never_carries_the_secret() -> None:
    """Anyone allowed ec2:DescribeInstanceAttribute reads user-data: a boot with a secret is
    refused, and the script names the SSM parameter the nodes read it from instead."""
    with pytest.raises(ProviderError, match="secret in user-data"):
        _render(boot=BootConfig("t-1", "aws", {}, secret="0123456789abcdef" * 4))
    script = _render()
    assert "FLOW_SECRET_PARAMETER=/flow-sdk/0123456789abcdef/t-1\n" in script
    assert "aws ssm get-parameter" in script


def test_template_is_package_data() -> None:
    assert _userdata.template().startswith("#!/bin/bash\n")


# -- the request as moto recorded it --------------------------------------------------------


def test_launch_as_recorded_by_moto(aws: AwsWorld, recorder: Recorder) -> None:
    provider = aws.provider(recorder)
    task_spec = spec(num_instances=3, priority="high")  # CPU nodes, on-demand
    started = provider.launch(request_for(aws, "train-rec-1", task_spec))

    assert [i.instance_id for i in started] == sorted(i.instance_id for i in started)
    assert len(started) == 3 and {i.state for i in started} <= {"pending", "running"}
    assert {(i.instance_type, i.market, i.usd_per_hour) for i in started} == {
        ("c7i.xlarge", "on-demand", 0.1785)}  # what cost tracking records
    plan = provider.plan(task_spec)
    assert (plan.instance_type, plan.region, plan.market, plan.usd_per_hour, plan.nodes) == (
        "c7i.xlarge", "us-east-1", "on-demand", 0.1785, 3)
    assert plan.alternatives > 0
    [sent] = recorder.run_instances
    assert (sent["MinCount"], sent["MaxCount"]) == (3, 3)  # moto ignores MaxCount: sent is truth
    ec2 = aws.client("ec2")
    raw = aws.instances()
    assert len(raw) == 3
    by_tag = [tag_dict(i["Tags"]) for i in raw]
    assert all(t["flow:task-id"] == "train-rec-1" and t["flow:role"] == "node"
               and t["flow:attempt"] == "1" and t["flow:market"] == "on-demand"
               and t["flow:store"] == "s3://flow-test-bucket/flow/" for t in by_tag)
    first = raw[0]
    assert first["InstanceType"] == "c7i.xlarge"  # the catalog's cheapest CPU on-demand offer
    assert first["ImageId"] == aws.amis["us-east-1"]  # resolved through the DLAMI SSM parameter
    assert first["MetadataOptions"]["HttpTokens"] == "required"
    assert first["ClientToken"] == client_token("train-rec-1", 1)
    assert first["KeyName"] == "flow-train-rec-1"
    assert first["Placement"]["AvailabilityZone"] == sent["Placement"]["AvailabilityZone"]
    assert {i.zone for i in started} == {sent["Placement"]["AvailabilityZone"]}
    assert "InstanceLifecycle" not in first  # on-demand
    assert all(i["IamInstanceProfile"]["Arn"].endswith("/" + sent["IamInstanceProfile"]["Name"])
               for i in raw)
    attr = ec2.describe_instance_attribute(InstanceId=first["InstanceId"],
                                           Attribute="instanceInitiatedShutdownBehavior")
    assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    user_data = base64.b64decode(ec2.describe_instance_attribute(
        InstanceId=first["InstanceId"], Attribute="userData")["UserData"]["Value"]).decode()
    assert user_data == sent["UserData"]
    assert "testing" not in user_data and "AWS_SECRET" not in user_data.upper().replace(
        "AWS_SECRET_ACCESS_KEY", "") and "aws_access_key" not in user_data.lower()
    boot = boot_of(user_data)
    assert boot.provider_config["launch"] == {"task_id": "train-rec-1",
                                                 "region": "us-east-1", "attempt": 1}
    volumes = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id",
                                             "Values": [first["InstanceId"]]}])["Volumes"]
    assert volumes and tag_dict(volumes[0]["Tags"])["flow:task-id"] == "train-rec-1"

    # the security group: all traffic within itself, SSH from the caller only, never the world
    [group_ref] = first["SecurityGroups"]
    [group] = ec2.describe_security_groups(GroupIds=[group_ref["GroupId"]])["SecurityGroups"]
    assert group["GroupName"] == "flow-train-rec-1"
    assert tag_dict(group["Tags"])["flow:task-id"] == "train-rec-1"
    rules = group["IpPermissions"]
    self_rule = [r for r in rules if r["IpProtocol"] == "-1"]
    assert self_rule and self_rule[0]["UserIdGroupPairs"][0]["GroupId"] == group["GroupId"]
    ssh = [r for r in rules if r.get("FromPort") == 22]
    assert ssh and [x["CidrIp"] for x in ssh[0]["IpRanges"]] == ["127.0.0.1/32"]
    assert all(x["CidrIp"] != "0.0.0.0/0" for r in rules for x in r.get("IpRanges", []))
    assert all(not r.get("Ipv6Ranges") for r in rules)

    # the per-task key pair: in EC2 with the task tag, its private half on disk, mode 0600
    [key] = ec2.describe_key_pairs(KeyNames=["flow-train-rec-1"])["KeyPairs"]
    assert tag_dict(key["Tags"])["flow:task-id"] == "train-rec-1"
    pem = key_path("train-rec-1", "us-east-1")
    assert stat.S_IMODE(os.stat(pem).st_mode) == 0o600

    # the nodes' instance profile is the task's own, holding exactly task_policy for this
    # task (test_iam_scoping checks what that policy allows and denies)
    iam = aws.client("iam")
    profile = iam.get_instance_profile(InstanceProfileName=sent["IamInstanceProfile"]["Name"])
    [role] = profile["InstanceProfile"]["Roles"]
    assert role["RoleName"] == role_name("s3://flow-test-bucket/flow/", "train-rec-1")
    policy = iam.get_role_policy(RoleName=role["RoleName"], PolicyName=TASK_POLICY_NAME)
    assert policy["PolicyDocument"] == task_policy(provider.nodes.task_access(
        "train-rec-1", task_spec, provider.nodes.ship_code()), role["Arn"])

    provider.terminate("train-rec-1")
    assert iam.list_roles()["Roles"] == []  # the task's role went with it
    assert aws.non_terminated() == []
    assert not pem.exists()
    assert ec2.describe_security_groups(Filters=[{"Name": "tag:flow:task-id",
                                                  "Values": ["train-rec-1"]}])[
        "SecurityGroups"] == []


def test_spot_priority_launches_spot_in_moto(aws: AwsWorld, recorder: Recorder) -> None:
    provider = aws.provider(recorder)
    provider.launch(request_for(aws, "spot-1", spec(num_instances=2, priority="low",
                                                    max_price_per_hour=1.0)))
    assert {i.get("InstanceLifecycle") for i in aws.instances()} == {"spot"}
    [sent] = recorder.run_instances
    assert sent["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] == "1.0000"
    provider.terminate("spot-1")


@pytest.mark.parametrize("interconnect", ["efa", "infiniband"])
def test_efa_launch_gets_a_cluster_placement_group_and_efa_interfaces(
        aws: AwsWorld, recorder: Recorder, interconnect: str) -> None:
    provider = aws.provider(recorder)
    task_spec = spec(gpu="a100:8", num_instances=2, internode_interconnect=interconnect,
                     priority="high")
    provider.launch(request_for(aws, "efa-1", task_spec))
    [sent] = recorder.run_instances
    assert sent["InstanceType"] == "p4d.24xlarge"  # a100-40gb x8 with EFA
    assert sent["Placement"]["GroupName"] == "flow-efa-1"
    assert [n["InterfaceType"] for n in sent["NetworkInterfaces"]] == ["efa"] * 4
    group = placement_groups()["flow-efa-1"]
    assert group["Strategy"] == "cluster"
    assert tag_dict(group["Tags"])["flow:task-id"] == "efa-1"
    raw = aws.instances()
    assert len(raw) == 2
    assert {i["NetworkInterfaces"][0]["SubnetId"] for i in raw} == {
        sent["NetworkInterfaces"][0]["SubnetId"]}
    assert boot_of(sent["UserData"]).task_id == "efa-1"
    assert "FLOW_INTERCONNECT=efa" in sent["UserData"]
    provider.terminate("efa-1")
    assert "flow-efa-1" not in placement_groups() and aws.non_terminated() == []


def test_user_named_key_pair_is_used_not_created(aws: AwsWorld, recorder: Recorder) -> None:
    aws.client("ec2").create_key_pair(KeyName="mine")
    provider = aws.provider(recorder)
    provider.launch(request_for(aws, "key-1", spec(key_name="mine", priority="high")))
    assert recorder.run_instances[0]["KeyName"] == "mine"
    assert not key_path("key-1", "us-east-1").exists()
    provider.terminate("key-1")
    assert aws.client("ec2").describe_key_pairs(KeyNames=["mine"])["KeyPairs"]  # kept


def test_missing_user_key_pair_names_the_field(aws: AwsWorld) -> None:
    provider = aws.provider()
    with pytest.raises(ProviderError, match="key_name: key pair 'nope' does not exist"):
        provider.launch(request_for(aws, "key-2", spec(key_name="nope", priority="high")))
    assert aws.non_terminated() == []
    assert aws.client("ec2").describe_security_groups(Filters=[
        {"Name": "tag:flow:task-id", "Values": ["key-2"]}])["SecurityGroups"] == []
