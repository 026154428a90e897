"""File volumes on EFS and block volumes on EBS, against moto (in-process): find or create,
idempotence, mount targets per zone, the NFS security group, the bootstrap's mount lines."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from flow_sdk.providers.aws import _ebs as ebs
from flow_sdk.providers.aws import _efs as efs
from flow_sdk.spec import VolumeSpec
from flow_sdk.volumes import (
    VolumeError,
    VolumeInUseError,
    create_volume,
    delete_volume,
    list_volumes,
)

REGION = "us-east-1"


@pytest.fixture()
def clients(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]
        subnets = {s["AvailabilityZone"]: s["SubnetId"] for s in ec2.describe_subnets(
            Filters=[{"Name": "vpc-id", "Values": [vpc["VpcId"]]}])["Subnets"]}
        nodes_sg = ec2.create_security_group(GroupName="flow-nodes", Description="nodes",
                                             VpcId=vpc["VpcId"])["GroupId"]
        yield {"efs": boto3.client("efs", region_name=REGION), "ec2": ec2,
               "vpc": vpc["VpcId"], "subnets": subnets, "nodes_sg": nodes_sg}


def test_file_system_is_created_once_and_found_by_creation_token(clients: dict[str, Any]) -> None:
    volume = VolumeSpec(name="ckpt", size_gb=500)
    first = efs.ensure_file_system(clients["efs"], volume, poll_s=0)
    again = efs.ensure_file_system(clients["efs"], volume, poll_s=0)
    assert first.created and not again.created and not first.imported
    assert again.file_system_id == first.file_system_id and again.size_gb == 500
    assert first.dns_name == f"{first.file_system_id}.efs.{REGION}.amazonaws.com"
    systems = clients["efs"].describe_file_systems()["FileSystems"]
    assert len(systems) == 1 and systems[0]["CreationToken"] == "ckpt"
    assert systems[0]["Encrypted"] is True
    assert [f.name for f in efs.list_file_systems(clients["efs"])] == ["ckpt"]


def test_a_file_system_made_elsewhere_is_imported_by_name_tag(clients: dict[str, Any]) -> None:
    made = clients["efs"].create_file_system(CreationToken="console-made",
                                             Tags=[{"Key": "Name", "Value": "datasets"}])
    found = efs.ensure_file_system(clients["efs"], VolumeSpec(name="datasets"), poll_s=0)
    assert found.file_system_id == made["FileSystemId"] and found.imported and not found.created
    assert len(clients["efs"].describe_file_systems()["FileSystems"]) == 1
    with pytest.raises(VolumeInUseError, match="not created by flow"):
        efs.delete_file_system(clients["efs"], "datasets", poll_s=0)
    clients["efs"].create_file_system(CreationToken="other",
                                      Tags=[{"Key": "Name", "Value": "datasets"}])
    with pytest.raises(VolumeError, match="several EFS file systems .* named 'datasets'"):
        efs.find_file_system(clients["efs"], "datasets")


def test_mount_targets_one_per_zone_with_an_nfs_group(clients: dict[str, Any]) -> None:
    fs = efs.ensure_file_system(clients["efs"], VolumeSpec(name="ckpt"), poll_s=0)
    group = efs.ensure_nfs_security_group(clients["ec2"], clients["vpc"], clients["nodes_sg"])
    assert efs.ensure_nfs_security_group(clients["ec2"], clients["vpc"],
                                         clients["nodes_sg"]) == group  # found, not duplicated
    [described] = clients["ec2"].describe_security_groups(GroupIds=[group])["SecurityGroups"]
    [rule] = described["IpPermissions"]
    assert (rule["FromPort"], rule["ToPort"], rule["IpProtocol"]) == (2049, 2049, "tcp")
    assert [p["GroupId"] for p in rule["UserIdGroupPairs"]] == [clients["nodes_sg"]]
    zone_a, zone_b = sorted(clients["subnets"])[:2]
    extra_in_a = clients["ec2"].create_subnet(VpcId=clients["vpc"], CidrBlock="172.31.240.0/24",
                                              AvailabilityZone=zone_a)["Subnet"]["SubnetId"]
    subnets = [clients["subnets"][zone_a], extra_in_a, clients["subnets"][zone_b]]
    targets = efs.ensure_mount_targets(clients["efs"], clients["ec2"], fs.file_system_id,
                                       subnets, [group], poll_s=0)
    assert sorted(t.zone for t in targets) == [zone_a, zone_b]  # EFS allows one per zone
    assert all(t.state == "available" for t in targets)
    again = efs.ensure_mount_targets(clients["efs"], clients["ec2"], fs.file_system_id,
                                     subnets, [group], poll_s=0)
    assert sorted(t.mount_target_id for t in again) == sorted(t.mount_target_id for t in targets)
    other_vpc = clients["ec2"].create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    stray = clients["ec2"].create_subnet(VpcId=other_vpc, CidrBlock="10.9.1.0/24",
                                         AvailabilityZone=zone_b)["Subnet"]["SubnetId"]
    with pytest.raises(VolumeError, match="launch the task in that VPC"):
        efs.ensure_mount_targets(clients["efs"], clients["ec2"], fs.file_system_id, [stray],
                                 [group], poll_s=0)
    assert efs.delete_file_system(clients["efs"], "ckpt", poll_s=0) is True
    assert clients["efs"].describe_file_systems()["FileSystems"] == []
    assert efs.delete_file_system(clients["efs"], "ckpt", poll_s=0) is False


def test_provision_file_volumes_returns_the_bootstrap_mount_lines(clients: dict[str, Any]) -> None:
    zone = min(clients["subnets"])
    script = efs.provision_file_volumes(
        clients["efs"], clients["ec2"],
        {"/shared/ckpt": VolumeSpec(name="ckpt"), "/scratch": VolumeSpec(name="s", interface="block")},
        subnet_ids=[clients["subnets"][zone]], node_security_group=clients["nodes_sg"], poll_s=0)
    [fs] = efs.list_file_systems(clients["efs"])  # the block volume is not EFS's business
    assert clients["efs"].describe_mount_targets(FileSystemId=fs.file_system_id)["MountTargets"]
    last = script.strip().splitlines()[-1]
    assert shlex.split(last) == ["flow_mount_efs", fs.dns_name, "/shared/ckpt"]
    assert "mount -t nfs4 -o nfsvers=4.1," in script
    syntax = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True,
                            check=False)
    assert syntax.returncode == 0, syntax.stderr
    assert efs.provision_file_volumes(clients["efs"], clients["ec2"], {}, subnet_ids=[],
                                      node_security_group="sg-x") == ""


def test_mount_script_quotes_every_value() -> None:
    fs = efs.FileSystem("fs-1", "x", REGION, "available", None)
    script = efs.mount_script({"/shared/it's": fs})
    assert script.strip().splitlines()[-1] == (
        "flow_mount_efs fs-1.efs.us-east-1.amazonaws.com '/shared/it'\"'\"'s'")


def test_block_volume_find_create_zone_attach(clients: dict[str, Any]) -> None:
    ec2 = clients["ec2"]
    zone_a, zone_b = sorted(clients["subnets"])[:2]
    volume = VolumeSpec(name="scratch", size_gb=20, interface="block")
    assert ebs.block_volume_zone(ec2, "scratch") is None
    made = ebs.ensure_block_volume(ec2, volume, zone_a, poll_s=0)
    assert made.created and made.zone == zone_a and made.size_gb == 20
    found = ebs.ensure_block_volume(ec2, volume, zone_a, poll_s=0)
    assert found.volume_id == made.volume_id and not found.created
    assert ebs.block_volume_zone(ec2, "scratch") == zone_a
    with pytest.raises(VolumeError, match=f"lives in {zone_a}, not {zone_b}"):
        ebs.ensure_block_volume(ec2, volume, zone_b, poll_s=0)
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    instance = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1,
                                 Placement={"AvailabilityZone": zone_a})["Instances"][0]
    ebs.attach_block_volume(ec2, made.volume_id, instance["InstanceId"], poll_s=0)
    with pytest.raises(VolumeInUseError, match="attached to"):
        ebs.ensure_block_volume(ec2, volume, zone_a, poll_s=0)
    with pytest.raises(VolumeInUseError, match="stop that task first"):
        ebs.delete_block_volume(ec2, "scratch")
    script = ebs.mount_script({"/scratch": found})
    assert shlex.split(script.strip().splitlines()[-1]) == [
        "flow_mount_ebs", made.volume_id, "/dev/sdf", "/scratch", "fresh"]  # created blank
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
    ec2.detach_volume(VolumeId=made.volume_id, InstanceId=instance["InstanceId"])
    assert ebs.delete_block_volume(ec2, "scratch") is True
    assert ebs.list_block_volumes(ec2) == []


def test_cli_functions_on_aws(clients: dict[str, Any]) -> None:
    zone = min(clients["subnets"])
    create_volume("ckpt", 100, provider="aws")
    create_volume("scratch", 8, "block", provider="aws", zone=zone)
    listed = [(v.name, v.interface, v.size_gb) for v in list_volumes("aws")]
    assert listed == [("ckpt", "file", 100), ("scratch", "block", 8)]
    assert delete_volume("ckpt", provider="aws") is True
    assert delete_volume("scratch", provider="aws") is True
    assert list_volumes("aws") == []
