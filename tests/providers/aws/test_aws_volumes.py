"""Volumes on AWS (moto): EFS file volumes, EBS block volumes, S3 mount grants, gc, check."""

from __future__ import annotations

import base64
import json
import subprocess
from typing import Any

import pytest
from aws_moto_world import AwsWorld, Ec2Faults, launch_ids, node_config_of, spec

from flow_sdk.errors import CapacityError, ProviderError
from flow_sdk.wire import BootConfig
from flow_sdk.providers.aws._iam import TASK_POLICY_NAME, role_name
from flow_sdk.providers.aws._userdata import USER_DATA_LIMIT
from flow_sdk.providers.base import LaunchRequest
from flow_sdk.providers.aws import _efs as flow_efs


def user_data(world: AwsWorld, instance_id: str) -> str:
    recorded = world.client("ec2").describe_instance_attribute(
        InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(recorded["UserData"]["Value"]).decode("utf-8")


def instance(world: AwsWorld, instance_id: str) -> dict[str, Any]:
    return next(i for i in world.instances() if i["InstanceId"] == instance_id)


FILE_VOLUME = {"/shared/ckpt": {"name": "ckpt", "size_gb": 50, "interface": "file"}}


def test_file_volume_gets_an_efs_with_a_mount_target_and_an_nfs_mount_before_the_agent(
        aws: AwsWorld) -> None:
    provider = aws.provider()
    task_spec = spec(num_instances=2, priority="high", volumes=FILE_VOLUME)
    assert provider.check(task_spec) == []
    ids = launch_ids(provider, "vol-efs-1", task_spec)
    efs = aws.client("efs")
    systems = efs.describe_file_systems(CreationToken="ckpt")["FileSystems"]
    assert len(systems) == 1
    fs_id = systems[0]["FileSystemId"]
    node = instance(aws, ids[0])
    targets = efs.describe_mount_targets(FileSystemId=fs_id)["MountTargets"]
    assert [t["SubnetId"] for t in targets] == [node["SubnetId"]]
    groups = efs.describe_mount_target_security_groups(
        MountTargetId=targets[0]["MountTargetId"])["SecurityGroups"]
    nfs = aws.client("ec2").describe_security_groups(GroupIds=groups)["SecurityGroups"][0]
    node_group = node["SecurityGroups"][0]["GroupId"]
    assert nfs["GroupName"] == flow_efs.NFS_GROUP_NAME
    assert [(p["FromPort"], [g["GroupId"] for g in p["UserIdGroupPairs"]])
            for p in nfs["IpPermissions"]] == [(2049, [node_group])]
    assert all(not p.get("IpRanges") for p in nfs["IpPermissions"])  # no CIDR, open or not

    script = user_data(aws, ids[0])
    assert len(script.encode()) < USER_DATA_LIMIT
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
    mount = script.index(f"flow_mount_efs {fs_id}.efs.us-east-1.amazonaws.com /shared/ckpt")
    assert script.index('mkdir -p "$FLOW_WORKDIR"') < mount
    assert mount < script.index("python -m flow_sdk.providers.aws._bootlog")
    assert mount < script.index("docker pull")

    # a second task finds the same file system (by creation token) and mount target
    again = launch_ids(provider, "vol-efs-2", spec(num_instances=1, priority="high",
                                                   volumes=FILE_VOLUME))
    assert [s["FileSystemId"] for s in efs.describe_file_systems()["FileSystems"]] == [fs_id]
    assert f"{fs_id}.efs.us-east-1.amazonaws.com" in user_data(aws, again[0])
    for task in ("vol-efs-1", "vol-efs-2"):  # terminating frees the NFS rules, keeps the EFS
        provider.terminate(task)
    nfs = aws.client("ec2").describe_security_groups(GroupIds=groups)["SecurityGroups"][0]
    assert nfs["IpPermissions"] == []
    assert [s["FileSystemId"] for s in efs.describe_file_systems()["FileSystems"]] == [fs_id]


def test_block_volume_is_created_in_the_launch_zone_and_attached(aws: AwsWorld) -> None:
    provider = aws.provider()
    task_spec = spec(num_instances=1, priority="high",
                     volumes={"/scratch": {"name": "scratch", "size_gb": 20,
                                           "interface": "block"}})
    assert provider.check(task_spec) == []
    [node_id] = launch_ids(provider, "vol-ebs-1", task_spec)
    node = instance(aws, node_id)
    volumes = aws.client("ec2").describe_volumes(
        Filters=[{"Name": "tag:flow:volume", "Values": ["scratch"]}])["Volumes"]
    assert len(volumes) == 1
    volume = volumes[0]
    assert volume["AvailabilityZone"] == node["Placement"]["AvailabilityZone"]
    assert volume["Size"] == 20 and volume["State"] == "in-use"
    assert [(a["InstanceId"], a["Device"]) for a in volume["Attachments"]] == [
        (node_id, "/dev/sdf")]
    script = user_data(aws, node_id)
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
    assert f"flow_mount_ebs {volume['VolumeId']} /dev/sdf /scratch fresh" in script
    provider.terminate("vol-ebs-1")


def test_s3_mount_buckets_are_granted_read_only_on_their_prefix(aws: AwsWorld) -> None:
    provider = aws.provider()
    launch_ids(provider, "vol-s3-1", spec(num_instances=1, priority="high",
                                          mounts={"/data": "s3://datasets/imagenet/train"}))
    launch_ids(provider, "vol-s3-2", spec(num_instances=1, priority="high",
                                          mounts={"/ref": "s3://refs"}))
    iam = aws.client("iam")

    def grants(task: str) -> set[tuple[str, str, str]]:
        policy = iam.get_role_policy(RoleName=role_name(provider.store_tag, task),
                                     PolicyName=TASK_POLICY_NAME)["PolicyDocument"]
        if isinstance(policy, str):
            policy = json.loads(policy)
        return {(s["Action"], json.dumps(s["Resource"]), json.dumps(s.get("Condition")))
                for s in policy["Statement"] if "Mount" in s["Sid"]}

    assert grants("vol-s3-1") == {  # each task's grants are its own
        ("s3:ListBucket", '"arn:aws:s3:::datasets"',
         '{"StringLike": {"s3:prefix": ["imagenet/train/*"]}}'),
        ("s3:GetObject", '["arn:aws:s3:::datasets/imagenet/train/*"]', "null")}
    assert grants("vol-s3-2") == {
        ("s3:ListBucket", '"arn:aws:s3:::refs"', "null"),
        ("s3:GetObject", '["arn:aws:s3:::refs/*"]', "null")}
    for task in ("vol-s3-1", "vol-s3-2"):
        provider.terminate(task)
    assert iam.list_roles()["Roles"] == []  # the grants went with their tasks


def test_gc_leaves_volumes_alone(aws: AwsWorld) -> None:
    provider = aws.provider()
    launch_ids(provider, "vol-gc-1", spec(num_instances=1, priority="high", volumes=FILE_VOLUME))
    launch_ids(provider, "vol-gc-2", spec(num_instances=1, priority="high",
                                          volumes={"/scratch": {"name": "scratch", "size_gb": 10,
                                                                "interface": "block"}}))
    report = provider.gc(ended={task: "task ended SUCCEEDED"  # what lifecycle passes
                                for task in ("vol-gc-1", "vol-gc-2")})
    assert len(report.terminated_instances) == 2
    # security groups, key pairs, the tasks' IAM roles, instance profiles and secret
    # parameters: no volume
    assert {item.split()[1] for item in report.deleted} <= {"security", "key", "role",
                                                            "instance", "parameter"}
    efs = aws.client("efs")
    assert [s["CreationToken"] for s in efs.describe_file_systems()["FileSystems"]] == ["ckpt"]
    volumes = aws.client("ec2").describe_volumes(
        Filters=[{"Name": "tag-key", "Values": ["flow:volume"]}])["Volumes"]
    assert [v["State"] for v in volumes] != [] and all(v["State"] != "deleted" for v in volumes)
    provider.gc()  # a second pass, after the instances are gone, still keeps them
    assert len(efs.describe_file_systems()["FileSystems"]) == 1
    assert len(aws.client("ec2").describe_volumes(
        Filters=[{"Name": "tag-key", "Values": ["flow:volume"]}])["Volumes"]) == 1


def test_simulated_cloud_takes_volumes_and_mounts(aws: AwsWorld) -> None:
    provider = aws.sim_provider()
    assert provider.check(spec(num_instances=1, priority="high", volumes=FILE_VOLUME,
                               mounts={"/data": "s3://datasets/x"})) == []
    block = {"/scratch": {"name": "scratch", "size_gb": 10, "interface": "block"}}
    assert provider.check(spec(num_instances=1, priority="high", volumes=block)) == []


def test_replacement_node_mounts_the_gangs_file_volume_in_its_zone(aws: AwsWorld) -> None:
    provider = aws.provider()
    task_spec = spec(num_instances=2, priority="high", max_restarts=1, volumes=FILE_VOLUME)
    ids = launch_ids(provider, "vol-rep-1", task_spec)
    gang_zone = instance(aws, ids[0])["Placement"]["AvailabilityZone"]
    node = aws.provider(**node_config_of(provider, ids[0], "us-east-1"))
    boot = BootConfig("vol-rep-1", "aws", node.config(), secret="0" * 64)
    [added] = node.add_instances(LaunchRequest("vol-rep-1", task_spec, boot), 1)
    fs_id = aws.client("efs").describe_file_systems(CreationToken="ckpt")["FileSystems"][0][
        "FileSystemId"]
    script = user_data(aws, added.instance_id)
    assert f"flow_mount_efs {fs_id}.efs.us-east-1.amazonaws.com /shared/ckpt" in script
    assert added.zone == gang_zone
    provider.terminate("vol-rep-1")


def test_block_volume_task_is_not_replaced(aws: AwsWorld) -> None:
    provider = aws.provider()
    task_spec = spec(num_instances=1, priority="high", max_restarts=1,
                     volumes={"/scratch": {"name": "scratch", "size_gb": 10,
                                           "interface": "block"}})
    [node_id] = launch_ids(provider, "vol-rep-2", task_spec)
    node = aws.provider(**node_config_of(provider, node_id, "us-east-1"))
    boot = BootConfig("vol-rep-2", "aws", node.config(), secret="0" * 64)
    with pytest.raises(ProviderError, match="block volume"):
        node.add_instances(LaunchRequest("vol-rep-2", task_spec, boot), 1)
    provider.terminate("vol-rep-2")


SCRATCH = {"/scratch": {"name": "scratch", "size_gb": 10, "interface": "block"}}


def test_an_existing_block_volume_pins_the_launch_zone(aws: AwsWorld) -> None:
    ec2 = aws.client("ec2")
    zones = sorted(z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"])
    made = ec2.create_volume(AvailabilityZone=zones[-1], Size=10, TagSpecifications=[{
        "ResourceType": "volume", "Tags": [{"Key": "flow:volume", "Value": "scratch"}]}])
    provider = aws.provider()
    [node_id] = launch_ids(provider, "vol-zone-1", spec(num_instances=1, priority="high",
                                                        volumes=SCRATCH))
    assert instance(aws, node_id)["Placement"]["AvailabilityZone"] == zones[-1]
    [volume] = ec2.describe_volumes(VolumeIds=[made["VolumeId"]])["Volumes"]
    assert [a["InstanceId"] for a in volume["Attachments"]] == [node_id]
    provider.terminate("vol-zone-1")


def test_a_failed_zone_keeps_later_tries_in_the_block_volumes_zone(
        aws: AwsWorld, ec2_faults: Ec2Faults) -> None:
    ec2_faults.capacity()  # no capacity anywhere: every try fails
    provider = aws.provider()
    with pytest.raises(CapacityError) as caught:
        launch_ids(provider, "vol-zone-2", spec(num_instances=1, priority="high", volumes=SCRATCH))
    [volume] = aws.client("ec2").describe_volumes(
        Filters=[{"Name": "tag:flow:volume", "Values": ["scratch"]}])["Volumes"]
    tried = {line.split(" in ")[1].split()[0].strip(":,") for line in str(caught.value).splitlines()
             if "InsufficientInstanceCapacity" in line and "us-east-1" in line}
    assert tried and tried <= {volume["AvailabilityZone"]}, str(caught.value)
    assert volume["State"] == "available"  # a persistent volume: kept for the next launch
    assert aws.non_terminated() == []
