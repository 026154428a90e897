"""What a task's gang needs in a region besides the instances, and how it is found and removed.

Per task and region (created on the first launch attempt there, tagged with the task id):
a security group that admits all traffic from itself and SSH from the caller's CIDR only, a key
pair unless the user names one, and a cluster placement group when EFA is asked for. Shared:
the default VPC and its per-zone default subnets and the AMI (the nodes' instance profile is
``_iam``'s).
"""

from __future__ import annotations

import ipaddress
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from flow_sdk._config import flow_home
from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws._clients import Clients, error_code, error_message, tolerating
from flow_sdk.providers.aws._config import AwsConfig, check_ssh_cidr
from flow_sdk.providers.aws._efs import NFS_GROUP_NAME

TAG_TASK = "flow:task-id"
TAG_ROLE = "flow:role"
TAG_ATTEMPT = "flow:attempt"
TAG_STORE = "flow:store"
TAG_MARKET = "flow:market"
TAG_PRICE = "flow:usd-per-hour"  # the catalog price of the offer the node was launched as
TAG_REPLACEMENT = "flow:replacement"  # on nodes started to replace lost ones: the try's id
NODE_ROLE = "node"
CHECKIP_URL = "https://checkip.amazonaws.com"


def resource_name(task_id: str) -> str:
    """The name of a task's security group, key pair and placement group."""
    return f"flow-{task_id}"


def tags(task_id: str, store_tag: str, **extra: str) -> list[dict[str, str]]:
    pairs = {TAG_TASK: task_id, TAG_STORE: store_tag, "Name": resource_name(task_id), **extra}
    return [{"Key": k, "Value": v} for k, v in pairs.items()]


def tag_value(resource: dict[str, Any], key: str) -> str | None:
    for tag in resource.get("Tags", []) or []:
        if tag.get("Key") == key:
            return str(tag.get("Value"))
    return None


def keys_dir() -> Path:
    return flow_home() / "aws" / "keys"


def key_path(task_id: str, region: str) -> Path:
    return keys_dir() / f"{task_id}.{region}.pem"


def caller_cidr(config: AwsConfig) -> str:
    """Who may SSH to the nodes: ``ssh_cidr``, loopback for an endpoint on loopback, else this
    machine's public IPv4 address as AWS sees it, /32."""
    if config.ssh_cidr is not None:
        return config.ssh_cidr
    if config.endpoint_url is not None:
        return "127.0.0.1/32"
    try:
        with urllib.request.urlopen(CHECKIP_URL, timeout=5) as response:
            text = response.read().decode().strip()
        address = ipaddress.ip_address(text)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ProviderError(f"could not find this machine's public IP at {CHECKIP_URL} for the "
                            f"nodes' SSH rule ({exc}); set provider_config ssh_cidr, e.g. "
                            "'203.0.113.7/32'") from exc
    return check_ssh_cidr(f"{address}/{address.max_prefixlen}")


@dataclass
class RegionContext:
    """One region's view of one task's launch; creates the per-task resources on demand."""

    clients: Clients
    config: AwsConfig
    region: str
    task_id: str
    store_tag: str
    _subnets: dict[str, str] | None = None
    _ami: str | None = None
    _root_device: str | None = None
    _security_group: str | None = None
    _key_name: str | None = None
    _placement_group: str | None = None
    created: list[str] = field(default_factory=list)

    @property
    def ec2(self) -> Any:
        return self.clients.get("ec2", self.region)

    @property
    def ec2_launch(self) -> Any:
        return self.clients.get("ec2", self.region, launch=True)

    def _fail(self, what: str, exc: ClientError, fix: str) -> ProviderError:
        return ProviderError(f"{self.region}: could not {what}: {error_code(exc)}: "
                             f"{error_message(exc)}; {fix}")

    # -- shared -----------------------------------------------------------------------------

    def vpc_id(self) -> str:
        try:
            vpcs = self.ec2.describe_vpcs(
                Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
        except ClientError as exc:
            raise self._fail("find the default VPC", exc,
                             "check your credentials and ec2:DescribeVpcs") from exc
        if not vpcs:
            raise ProviderError(f"{self.region} has no default VPC; create one with `aws ec2 "
                                f"create-default-vpc --region {self.region}` or launch in "
                                "another region (provider_config regions)")
        return str(vpcs[0]["VpcId"])

    def subnets(self) -> dict[str, str]:
        """Availability zone -> default subnet of the default VPC."""
        if self._subnets is None:
            response = self.ec2.describe_subnets(Filters=[
                {"Name": "vpc-id", "Values": [self.vpc_id()]},
                {"Name": "default-for-az", "Values": ["true"]}])
            self._subnets = {s["AvailabilityZone"]: s["SubnetId"] for s in response["Subnets"]}
        return self._subnets

    def zones_for(self, instance_type: str) -> list[str]:
        """Zones of this region that offer ``instance_type`` and have a default subnet."""
        offered: set[str] = set()
        pages = self.ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}])
        for page in pages:
            offered.update(o["Location"] for o in page["InstanceTypeOfferings"])
        return sorted(offered & set(self.subnets()))

    def ami_id(self) -> str:
        if self._ami is None:
            if self.config.ami_id is not None:
                self._ami = self.config.ami_id
            else:
                name = self.config.ami_ssm_parameter
                try:
                    value = self.clients.get("ssm", self.region).get_parameter(Name=name)
                except ClientError as exc:
                    raise self._fail(f"resolve the node AMI from SSM parameter {name}", exc,
                                     "set provider_config ami_id, or ami_ssm_parameter to a "
                                     "parameter that exists in this region") from exc
                self._ami = str(value["Parameter"]["Value"])
        return self._ami

    def root_device(self) -> str:
        """The AMI's root device name (the node's root volume is resized through it)."""
        if self._root_device is None:
            ami = self.ami_id()
            try:
                images = self.ec2.describe_images(ImageIds=[ami])["Images"]
            except ClientError as exc:
                raise self._fail(f"find AMI {ami}", exc, "set provider_config ami_id to an "
                                 "AMI that exists in this region") from exc
            if not images:
                raise ProviderError(f"{self.region}: AMI {ami} does not exist here; set "
                                    "provider_config ami_id to an AMI of this region")
            self._root_device = str(images[0].get("RootDeviceName") or "/dev/sda1")
        return self._root_device

    # -- per task ---------------------------------------------------------------------------

    def security_group(self, ssh_cidr: str) -> str:
        if self._security_group is not None:
            return self._security_group
        name = resource_name(self.task_id)
        vpc = self.vpc_id()
        ec2 = self.ec2
        try:
            group_id = ec2.create_security_group(
                GroupName=name, VpcId=vpc,
                Description=f"flow-sdk task {self.task_id}: all traffic within the group, "
                            "SSH from the caller",
                TagSpecifications=[{"ResourceType": "security-group",
                                    "Tags": tags(self.task_id, self.store_tag)}])["GroupId"]
        except ClientError as exc:
            if error_code(exc) != "InvalidGroup.Duplicate":
                raise self._fail(f"create security group {name}", exc,
                                 "grant ec2:CreateSecurityGroup") from exc
            group_id = ec2.describe_security_groups(Filters=[
                {"Name": "group-name", "Values": [name]},
                {"Name": "vpc-id", "Values": [vpc]}])["SecurityGroups"][0]["GroupId"]
            self._security_group = str(group_id)
            return self._security_group
        self.created.append(f"security group {group_id}")
        network = ipaddress.ip_network(ssh_cidr)
        ssh_range = ({"Ipv6Ranges": [{"CidrIpv6": str(network), "Description": "flow: caller"}]}
                     if network.version == 6 else
                     {"IpRanges": [{"CidrIp": str(network), "Description": "flow: caller"}]})
        try:
            ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[
                {"IpProtocol": "-1", "UserIdGroupPairs": [
                    {"GroupId": group_id, "Description": "flow: nodes of this task"}]},
                {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ssh_range},
            ])
        except ClientError as exc:
            raise self._fail(f"add the ingress rules of {group_id}", exc,
                             "grant ec2:AuthorizeSecurityGroupIngress") from exc
        self._security_group = str(group_id)
        return self._security_group

    def key_name(self, user_key: str | None) -> str:
        if self._key_name is not None:
            return self._key_name
        ec2 = self.ec2
        if user_key is not None:
            try:
                ec2.describe_key_pairs(KeyNames=[user_key])
            except ClientError as exc:
                raise ProviderError(f"key_name: key pair {user_key!r} does not exist in "
                                    f"{self.region} ({error_code(exc)}); import it there, or "
                                    "leave key_name unset for a per-task key") from exc
            self._key_name = user_key
            return user_key
        name = resource_name(self.task_id)
        path = key_path(self.task_id, self.region)
        try:
            material = ec2.create_key_pair(
                KeyName=name, KeyType="ed25519",
                TagSpecifications=[{"ResourceType": "key-pair",
                                    "Tags": tags(self.task_id, self.store_tag)}])["KeyMaterial"]
        except ClientError as exc:
            if error_code(exc) != "InvalidKeyPair.Duplicate" or not path.exists():
                raise self._fail(f"create key pair {name}", exc,
                                 "grant ec2:CreateKeyPair, or set key_name") from exc
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(material)
            self.created.append(f"key pair {name}")
        self._key_name = name
        return name

    def placement_group(self) -> str:
        if self._placement_group is not None:
            return self._placement_group
        name = resource_name(self.task_id)
        try:
            self.ec2.create_placement_group(
                GroupName=name, Strategy="cluster",
                TagSpecifications=[{"ResourceType": "placement-group",
                                    "Tags": tags(self.task_id, self.store_tag)}])
            self.created.append(f"placement group {name}")
        except ClientError as exc:
            if error_code(exc) != "InvalidPlacementGroup.Duplicate":
                raise self._fail(f"create placement group {name}", exc,
                                 "grant ec2:CreatePlacementGroup") from exc
        self._placement_group = name
        return name


@dataclass
class Cleanup:
    """What removing a task's resources did: deleted, and deferred (still in use)."""

    deleted: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)


def _tag_filter(task_id: str | None) -> list[dict[str, Any]]:
    if task_id is None:
        return [{"Name": "tag-key", "Values": [TAG_TASK]}]
    return [{"Name": f"tag:{TAG_TASK}", "Values": [task_id]}]


def tagged_resources(ec2: Any, task_id: str | None, *, placement_groups: bool
                     ) -> dict[str, list[dict[str, Any]]]:
    """Security groups, key pairs and (when asked) placement groups carrying the task tag
    (any task when ``task_id`` is None)."""
    found: dict[str, list[dict[str, Any]]] = {"security_groups": [], "key_pairs": [],
                                              "placement_groups": []}
    for page in ec2.get_paginator("describe_security_groups").paginate(
            Filters=_tag_filter(task_id)):
        found["security_groups"].extend(page["SecurityGroups"])
    found["key_pairs"] = ec2.describe_key_pairs(Filters=_tag_filter(task_id))["KeyPairs"]
    if placement_groups:
        found["placement_groups"] = ec2.describe_placement_groups(
            Filters=_tag_filter(task_id))["PlacementGroups"]
    return found


def release_nfs_rules(ec2: Any, group_id: str) -> None:
    """Revoke the rules of flow's EFS mount-target groups (``_efs``) that admit
    NFS from the task's group ``group_id``: a referenced group cannot be deleted. Only that
    one rule goes; other tasks' rules, and every group flow did not name, are left alone."""
    groups = ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [NFS_GROUP_NAME]}])["SecurityGroups"]
    for nfs in groups:
        for permission in nfs.get("IpPermissions", []):
            pairs = [p for p in permission.get("UserIdGroupPairs", [])
                     if p.get("GroupId") == group_id]
            if not pairs:
                continue
            rule = {"IpProtocol": permission["IpProtocol"],
                    "FromPort": permission.get("FromPort"), "ToPort": permission.get("ToPort"),
                    "UserIdGroupPairs": [{"GroupId": group_id}]}
            with tolerating("InvalidPermission.NotFound"):  # revoked meanwhile
                ec2.revoke_security_group_ingress(GroupId=nfs["GroupId"], IpPermissions=[rule])


def delete_resources(ec2: Any, region: str, found: dict[str, list[dict[str, Any]]]) -> Cleanup:
    """Delete what ``tagged_resources`` found. A group still used by instances that are
    shutting down is deferred (``flow gc`` removes it later); one that another teardown (a
    concurrent ``flow gc``, a second client) deleted meanwhile counts as gone."""
    result = Cleanup()
    for group in found["security_groups"]:
        release_nfs_rules(ec2, group["GroupId"])
        try:
            ec2.delete_security_group(GroupId=group["GroupId"])
            result.deleted.append(f"{region} security group {group['GroupId']}")
        except ClientError as exc:
            if error_code(exc) == "InvalidGroup.NotFound":
                continue
            if error_code(exc) not in ("DependencyViolation", "InvalidGroup.InUse"):
                raise
            result.deferred.append(f"{region} security group {group['GroupId']} (in use)")
    for key in found["key_pairs"]:
        with tolerating("InvalidKeyPair.NotFound"):
            ec2.delete_key_pair(KeyName=key["KeyName"])
            result.deleted.append(f"{region} key pair {key['KeyName']}")
        task = tag_value(key, TAG_TASK)
        if task:
            key_path(task, region).unlink(missing_ok=True)
    for group in found["placement_groups"]:
        try:
            ec2.delete_placement_group(GroupName=group["GroupName"])
            result.deleted.append(f"{region} placement group {group['GroupName']}")
        except ClientError as exc:
            if error_code(exc) == "InvalidPlacementGroup.Unknown":
                continue
            if error_code(exc) != "InvalidPlacementGroup.InUse":
                raise
            result.deferred.append(f"{region} placement group {group['GroupName']} (in use)")
    return result
