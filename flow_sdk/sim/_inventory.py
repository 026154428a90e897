"""What the simulated account still holds: what ``flow gc --dry-run --provider aws-sim``
lists after its usual report (the aws gc names only what it would reclaim)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flow_sdk.providers.aws._clients import Clients
from flow_sdk.providers.gcreport import GcReport

_LIVE_STATES = ["pending", "running", "stopping", "stopped"]


@dataclass
class SimGcReport(GcReport):
    """A gc report with the account's holdings (``holds``), one line each."""

    holds: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [super().__str__()]
        if self.holds:
            lines.append(f"{self.provider}: the simulated account holds {len(self.holds)} "
                         "resource(s):")
            lines += [f"  {item}" for item in self.holds]
        else:
            lines.append(f"{self.provider}: the simulated account holds nothing (no "
                         "instances, security groups, key pairs, placement groups, roles, "
                         "instance profiles or volumes)")
        return "\n".join(lines)


def _ec2(ec2: Any, region: str) -> list[str]:
    held = []
    for reservation in ec2.describe_instances(Filters=[
            {"Name": "instance-state-name", "Values": _LIVE_STATES}])["Reservations"]:
        held += [f"{region} instance {i['InstanceId']} ({i['State']['Name']})"
                 for i in reservation["Instances"]]
    held += [f"{region} security group {g['GroupId']} ({g['GroupName']})"
             for g in ec2.describe_security_groups()["SecurityGroups"]
             if g["GroupName"] != "default"]
    held += [f"{region} key pair {k['KeyName']}" for k in ec2.describe_key_pairs()["KeyPairs"]]
    held += [f"{region} placement group {g['GroupName']}"
             for g in ec2.describe_placement_groups()["PlacementGroups"]]
    held += [f"{region} EBS volume {v['VolumeId']} ({v['State']}, {v['Size']} GB)"
             for v in ec2.describe_volumes()["Volumes"]]
    return held


def holdings(clients: Clients, region: str) -> list[str]:
    """Instances not terminated, security groups (but the default ones), key pairs,
    placement groups, EBS volumes and EFS file systems of ``region``, and IAM roles and
    instance profiles: whatever a launch creates besides stored objects and logs."""
    held = _ec2(clients.get("ec2", region), region)
    held += [f"{region} EFS file system {f['FileSystemId']}"
             for f in clients.get("efs", region).describe_file_systems()["FileSystems"]]
    iam = clients.get("iam", region)
    held += [f"role {r['RoleName']}" for r in iam.list_roles()["Roles"]]
    held += [f"instance profile {p['InstanceProfileName']}"
             for p in iam.list_instance_profiles()["InstanceProfiles"]]
    return held
