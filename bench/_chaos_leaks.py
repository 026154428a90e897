"""What a chaos scenario left behind, found by looking, not by bookkeeping: processes in
``/proc``, the simulated account's state (moto, asked directly, past the fault proxy), the
mount table and ``losetup``.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from _chaos_account import Account
from _chaos_procs import scan


def account_leftovers(account: Account) -> list[str]:
    """Instances not terminated, security groups (but the default), key pairs, placement
    groups, IAM roles and instance profiles of the whole account."""
    ec2, iam = account.client("ec2"), account.client("iam")
    found = [f"instance {i['InstanceId']} ({i['State']['Name']})"
             for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
             if i["State"]["Name"] not in ("terminated",)]
    found += [f"security group {g['GroupId']} {g['GroupName']}"
              for g in ec2.describe_security_groups()["SecurityGroups"]
              if g["GroupName"] != "default"]
    found += [f"key pair {k['KeyName']}" for k in ec2.describe_key_pairs()["KeyPairs"]]
    found += [f"placement group {g['GroupName']}"
              for g in ec2.describe_placement_groups()["PlacementGroups"]]
    found += [f"iam role {r['RoleName']}" for r in iam.list_roles()["Roles"]]
    found += [f"instance profile {p['InstanceProfileName']}"
              for p in iam.list_instance_profiles()["InstanceProfiles"]]
    return found


def purge_account(account: Account) -> None:
    """Remove what a leaking scenario left, so the next one is judged on its own."""
    ec2, iam = account.client("ec2"), account.client("iam")
    live = [i["InstanceId"] for r in ec2.describe_instances()["Reservations"]
            for i in r["Instances"] if i["State"]["Name"] != "terminated"]
    if live:
        ec2.terminate_instances(InstanceIds=live)
    for group in ec2.describe_security_groups()["SecurityGroups"]:
        if group["GroupName"] != "default":
            ec2.delete_security_group(GroupId=group["GroupId"])
    for key in ec2.describe_key_pairs()["KeyPairs"]:
        ec2.delete_key_pair(KeyName=key["KeyName"])
    for group in ec2.describe_placement_groups()["PlacementGroups"]:
        ec2.delete_placement_group(GroupName=group["GroupName"])
    for profile in iam.list_instance_profiles()["InstanceProfiles"]:
        for role in profile["Roles"]:
            iam.remove_role_from_instance_profile(
                InstanceProfileName=profile["InstanceProfileName"], RoleName=role["RoleName"])
        iam.delete_instance_profile(InstanceProfileName=profile["InstanceProfileName"])
    for role in iam.list_roles()["Roles"]:
        for name in iam.list_role_policies(RoleName=role["RoleName"])["PolicyNames"]:
            iam.delete_role_policy(RoleName=role["RoleName"], PolicyName=name)
        iam.delete_role(RoleName=role["RoleName"])


def mounts_under(root: Path, own: Path | None = None) -> list[str]:
    """Mount points of this machine's mount table under ``root`` (but the harness's ``own``)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if own is not None and point == str(own):
            continue
        if point == str(root) or point.startswith(f"{root}/"):
            found.append(f"mount {point}")
    return found


def loops_under(root: Path) -> list[str]:
    """Loop devices whose backing file lies under ``root`` (``losetup -a``)."""
    listing = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False)
    return [f"loop {line.split(':', 1)[0]}" for line in listing.stdout.splitlines()
            if str(root) in line]


def leftovers(home: Path, account: Account | None, exclude: set[int], settle_s: float,
              own_mount: Path | None = None) -> list[str]:
    """Everything the scenario whose data directory is ``home`` left: processes, the
    account's resources (``account``: the simulated account), mounts and loop devices; asked
    again for up to ``settle_s`` while anything is found (teardown takes a moment)."""
    deadline = time.monotonic() + settle_s
    while True:
        found = [f"process {p.describe()}" for p in scan(home, exclude)]
        if account is not None:
            found += account_leftovers(account)
        found += mounts_under(home, own_mount) + loops_under(home)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.3)
