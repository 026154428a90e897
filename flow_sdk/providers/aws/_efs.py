"""File volumes on AWS: EFS file systems, found by name or created, mounted over NFS.

The aws provider calls :func:`provision_file_volumes` before it launches a gang (it knows the
subnet and the nodes' security group then) and puts the returned script into the node's
user-data, where it runs before the agent starts: every node mounts every file volume at its
mount path.

* A file system is found by ``CreationToken == name`` (what flow creates), else by its
  ``Name`` or ``flow:volume`` tag (a file system made elsewhere is imported), else created with
  ``CreationToken=name`` (idempotent: a concurrent create returns the same file system).
* Mount targets: one per availability zone of the given subnets (EFS allows one per zone),
  with a security group that admits NFS (TCP 2049) from the nodes' security group.
* The mount script installs the NFS client when missing and retries the mount while the
  mount target's DNS name propagates.

Every function takes boto3 clients (``efs``, ``ec2``) so callers choose region, endpoint and
credentials; nothing here reads credentials itself.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from flow_sdk.spec import VolumeSpec
from flow_sdk.errors import VolumeError, VolumeInUseError

NFS_PORT = 2049
MOUNT_OPTIONS = "nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport"
TAG_VOLUME = "flow:volume"
TAG_SIZE = "flow:size-gb"
NFS_GROUP_NAME = "flow-efs-nfs"
_GONE = ("deleting", "deleted")


@dataclass(frozen=True)
class FileSystem:
    """One EFS file system standing for a flow file volume."""

    file_system_id: str
    name: str
    region: str
    state: str
    size_gb: int | None  # recorded at creation (EFS grows as needed)
    created: bool = False  # this call created it
    imported: bool = False  # found by tag, not made by flow

    @property
    def dns_name(self) -> str:
        """The NFS server name nodes mount (resolves in the VPC once a mount target exists)."""
        return f"{self.file_system_id}.efs.{self.region}.amazonaws.com"


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _tags(description: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in description.get("Tags", [])}


def _file_system(description: Mapping[str, Any], region: str, name: str, *,
                 created: bool = False) -> FileSystem:
    tags = _tags(description)
    size = tags.get(TAG_SIZE)
    imported = description.get("CreationToken") != name
    return FileSystem(description["FileSystemId"], name, region, description["LifeCycleState"],
                      int(size) if size and size.isdigit() else None, created, imported)


def _all_file_systems(efs: Any) -> Iterator[dict[str, Any]]:
    marker: str | None = None
    while True:
        page = efs.describe_file_systems(**({"Marker": marker} if marker else {}))
        yield from page.get("FileSystems", [])
        marker = page.get("NextMarker")
        if not marker:
            return


def _region(efs: Any) -> str:
    return str(efs.meta.region_name)


def find_file_system(efs: Any, name: str) -> FileSystem | None:
    """The file system of volume ``name``: by creation token, else by ``Name``/``flow:volume``
    tag. Raises VolumeError when several file systems carry the name."""
    VolumeSpec(name=name)
    region = _region(efs)
    by_token = [d for d in efs.describe_file_systems(CreationToken=name).get("FileSystems", [])
                if d["LifeCycleState"] not in _GONE]
    if by_token:
        return _file_system(by_token[0], region, name)
    tagged = [d for d in _all_file_systems(efs) if d["LifeCycleState"] not in _GONE
              and name in (_tags(d).get("Name"), _tags(d).get(TAG_VOLUME))]
    if len(tagged) > 1:
        ids = ", ".join(d["FileSystemId"] for d in tagged)
        raise VolumeError(f"several EFS file systems in {region} are named {name!r} ({ids}); "
                          f"tag the one to use with {TAG_VOLUME}={name} and rename the others")
    return _file_system(tagged[0], region, name) if tagged else None


def _wait_file_system(efs: Any, file_system_id: str, timeout_s: float, poll_s: float
                      ) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = efs.describe_file_systems(FileSystemId=file_system_id)["FileSystems"][0]
        state = found["LifeCycleState"]
        if state == "available":
            return dict(found)
        if state in (*_GONE, "error"):
            raise VolumeError(f"EFS file system {file_system_id} is {state}, not available")
        if time.monotonic() >= deadline:
            raise VolumeError(f"EFS file system {file_system_id} is still {state} after "
                              f"{timeout_s:.0f}s")
        time.sleep(poll_s)


def ensure_file_system(efs: Any, volume: VolumeSpec, *, timeout_s: float = 300.0,
                       poll_s: float = 2.0) -> FileSystem:
    """Find or create the file system of ``volume`` and wait until it is available."""
    if volume.interface != "file":
        raise VolumeError(f"volume {volume.name!r} has interface={volume.interface!r}; EFS "
                          "serves interface='file' volumes")
    region = _region(efs)
    found = find_file_system(efs, volume.name)
    created = False
    if found is None:
        tags = [{"Key": "Name", "Value": volume.name}, {"Key": TAG_VOLUME, "Value": volume.name},
                {"Key": TAG_SIZE, "Value": str(volume.size_gb)}]
        try:
            efs.create_file_system(CreationToken=volume.name, PerformanceMode="generalPurpose",
                                   ThroughputMode="elastic", Encrypted=True, Tags=tags)
            created = True
        except ClientError as exc:  # only a lost creation race is expected
            if _error_code(exc) != "FileSystemAlreadyExists":
                raise VolumeError(f"could not create EFS file system {volume.name!r} in "
                                  f"{region}: {exc}") from exc
        found = find_file_system(efs, volume.name)
        if found is None:
            raise VolumeError(f"EFS file system {volume.name!r} vanished right after creation")
    ready = _wait_file_system(efs, found.file_system_id, timeout_s, poll_s)
    return _file_system(ready, region, volume.name, created=created)


@dataclass(frozen=True)
class MountTarget:
    mount_target_id: str
    subnet_id: str
    zone: str
    ip_address: str
    state: str


def _mount_targets(efs: Any, file_system_id: str) -> list[dict[str, Any]]:
    targets: list[dict[str, Any]] = []
    marker: str | None = None
    while True:
        page = efs.describe_mount_targets(FileSystemId=file_system_id,
                                          **({"Marker": marker} if marker else {}))
        targets.extend(page.get("MountTargets", []))
        marker = page.get("NextMarker")
        if not marker:
            return targets


def ensure_nfs_security_group(ec2: Any, vpc_id: str, client_group_id: str) -> str:
    """The security group for mount targets in ``vpc_id``: NFS (TCP 2049) from members of
    ``client_group_id`` (the nodes' group). Created once per VPC; returns its id."""
    groups = ec2.describe_security_groups(Filters=[
        {"Name": "vpc-id", "Values": [vpc_id]},
        {"Name": "group-name", "Values": [NFS_GROUP_NAME]}])["SecurityGroups"]
    if groups:
        group_id = str(groups[0]["GroupId"])
    else:
        group_id = str(ec2.create_security_group(
            GroupName=NFS_GROUP_NAME, VpcId=vpc_id,
            Description="flow-sdk: NFS from flow nodes to EFS mount targets")["GroupId"])
    rule = {"IpProtocol": "tcp", "FromPort": NFS_PORT, "ToPort": NFS_PORT,
            "UserIdGroupPairs": [{"GroupId": client_group_id}]}
    try:
        ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[rule])
    except ClientError as exc:  # an existing rule is fine
        if _error_code(exc) != "InvalidPermission.Duplicate":
            raise VolumeError(f"could not open NFS in security group {group_id}: {exc}") from exc
    return group_id


def ensure_mount_targets(efs: Any, ec2: Any, file_system_id: str, subnet_ids: Sequence[str],
                         security_group_ids: Sequence[str], *, timeout_s: float = 300.0,
                         poll_s: float = 2.0) -> list[MountTarget]:
    """A mount target in the zone of each subnet (skipping zones that have one), all
    available. Returns the file system's mount targets."""
    subnets = ec2.describe_subnets(SubnetIds=list(subnet_ids))["Subnets"]
    existing = _mount_targets(efs, file_system_id)
    vpcs = {t["VpcId"] for t in existing if t.get("VpcId")}
    covered = {t.get("AvailabilityZoneName") for t in existing}
    for subnet in sorted(subnets, key=lambda s: s["SubnetId"]):
        if vpcs and subnet["VpcId"] not in vpcs:
            raise VolumeError(f"EFS file system {file_system_id} has mount targets in "
                              f"{', '.join(sorted(vpcs))}, not in {subnet['VpcId']} of subnet "
                              f"{subnet['SubnetId']}; launch the task in that VPC")
        if subnet["AvailabilityZone"] in covered:
            continue
        try:
            efs.create_mount_target(FileSystemId=file_system_id, SubnetId=subnet["SubnetId"],
                                    SecurityGroups=list(security_group_ids))
        except ClientError as exc:  # a target made in the meantime is fine
            if _error_code(exc) != "MountTargetConflict":
                raise VolumeError(f"could not create an EFS mount target for {file_system_id} "
                                  f"in {subnet['SubnetId']}: {exc}") from exc
        covered.add(subnet["AvailabilityZone"])
    deadline = time.monotonic() + timeout_s
    while True:
        targets = _mount_targets(efs, file_system_id)
        pending = [t for t in targets if t["LifeCycleState"] != "available"]
        if not pending:
            return [MountTarget(t["MountTargetId"], t["SubnetId"],
                                t.get("AvailabilityZoneName", ""), t.get("IpAddress", ""),
                                t["LifeCycleState"]) for t in targets]
        if time.monotonic() >= deadline:
            raise VolumeError(f"EFS mount targets {[t['MountTargetId'] for t in pending]} are "
                              f"not available after {timeout_s:.0f}s")
        time.sleep(poll_s)


_MOUNT_FUNCTION = f"""flow_mount_efs() {{
  mkdir -p "$2"
  if ! command -v mount.nfs4 >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nfs-common >/dev/null
    else
      yum install -y -q nfs-utils
    fi
  fi
  for attempt in $(seq 1 60); do
    if mount -t nfs4 -o {MOUNT_OPTIONS} "$1:/" "$2"; then return 0; fi
    sleep 5
  done
  echo "flow bootstrap: could not mount EFS $1 at $2" >&2
  return 1
}}"""


def mount_script(mounts: Mapping[str, FileSystem]) -> str:
    """Bash lines that mount each file system at its path (``{path: file_system}``); every
    value is a single-quoted shell word. Empty for no mounts."""
    if not mounts:
        return ""
    lines = [_MOUNT_FUNCTION]
    for path, fs in sorted(mounts.items()):
        lines.append(f"flow_mount_efs {shlex.quote(fs.dns_name)} {shlex.quote(path)}")
    return "\n".join(lines) + "\n"


def provision_file_volumes(efs: Any, ec2: Any, volumes: Mapping[str, VolumeSpec], *,
                           subnet_ids: Sequence[str], node_security_group: str,
                           timeout_s: float = 300.0, poll_s: float = 2.0) -> str:
    """Everything a gang's file volumes need before launch: file systems, the NFS security
    group, mount targets in ``subnet_ids``. Returns the user-data lines that mount them."""
    files = {path: v for path, v in volumes.items() if v.interface == "file"}
    if not files:
        return ""
    subnets = ec2.describe_subnets(SubnetIds=list(subnet_ids))["Subnets"]
    vpc_ids = sorted({s["VpcId"] for s in subnets})
    if len(vpc_ids) != 1:
        raise VolumeError(f"the task's subnets span {len(vpc_ids)} VPCs ({vpc_ids}); EFS "
                          "mount targets need one VPC")
    group = ensure_nfs_security_group(ec2, vpc_ids[0], node_security_group)
    mounted: dict[str, FileSystem] = {}
    for path, volume in sorted(files.items()):
        fs = ensure_file_system(efs, volume, timeout_s=timeout_s, poll_s=poll_s)
        ensure_mount_targets(efs, ec2, fs.file_system_id, subnet_ids, [group],
                             timeout_s=timeout_s, poll_s=poll_s)
        mounted[path] = fs
    return mount_script(mounted)


def list_file_systems(efs: Any) -> list[FileSystem]:
    """The file systems flow created or tagged as volumes (``flow:volume`` tag)."""
    region = _region(efs)
    found = []
    for d in _all_file_systems(efs):
        name = _tags(d).get(TAG_VOLUME)
        if name and d["LifeCycleState"] not in _GONE:
            found.append(_file_system(d, region, name))
    return sorted(found, key=lambda f: f.name)


def delete_file_system(efs: Any, name: str, *, timeout_s: float = 300.0,
                       poll_s: float = 2.0) -> bool:
    """Delete the file system of volume ``name`` (its mount targets first); False when there
    is none. Refuses (VolumeInUseError) a file system flow did not create."""
    fs = find_file_system(efs, name)
    if fs is None:
        return False
    if fs.imported:
        raise VolumeInUseError(f"EFS file system {fs.file_system_id} was not created by flow "
                               f"(its creation token is not {name!r}); delete it in the AWS "
                               "console or CLI")
    for target in _mount_targets(efs, fs.file_system_id):
        efs.delete_mount_target(MountTargetId=target["MountTargetId"])
    deadline = time.monotonic() + timeout_s
    while _mount_targets(efs, fs.file_system_id):
        if time.monotonic() >= deadline:
            raise VolumeError(f"mount targets of {fs.file_system_id} still exist after "
                              f"{timeout_s:.0f}s")
        time.sleep(poll_s)
    efs.delete_file_system(FileSystemId=fs.file_system_id)
    return True
