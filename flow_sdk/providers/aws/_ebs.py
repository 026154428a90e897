"""Block volumes on AWS: EBS volumes, found by tag or created, attached to one node.

A block volume lives in one availability zone and attaches to one instance at a time, which
is why ``interface="block"`` is single-node (``TaskSpec`` rejects it with ``num_instances >
1``). The aws provider:

1. before launch: :func:`block_volume_zone` (launch in the zone of an existing volume) and
   :func:`ensure_block_volume` (find or create it in the launch zone);
2. after ``run_instances``: :func:`attach_block_volume` for the node;
3. in user-data: :func:`mount_script`, which waits for the device and mounts it before the
   agent starts. It makes an ext4 file system only on a volume flow created and tagged
   ``flow:formatted=false`` (and that ``blkid``, asked three times a second apart, finds
   blank), then tags it formatted; on any
   other volume it refuses to format, so a ``blkid`` that fails transiently can never wipe
   a volume holding data.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from flow_sdk.spec import VolumeSpec
from flow_sdk.errors import VolumeError, VolumeInUseError

TAG_VOLUME = "flow:volume"
TAG_FORMATTED = "flow:formatted"  # "false" from creation until the node made its file system
DEVICES = tuple(f"/dev/sd{letter}" for letter in "fghijklmnop")


@dataclass(frozen=True)
class BlockVolume:
    """One EBS volume standing for a flow block volume."""

    volume_id: str
    name: str
    zone: str
    size_gb: int
    state: str  # creating | available | in-use | ...
    attached_to: str | None  # instance id
    created: bool = False
    never_formatted: bool = False  # flow created it blank and no node has formatted it yet


def _volume(d: Mapping[str, Any], name: str, created: bool = False) -> BlockVolume:
    attached = [a["InstanceId"] for a in d.get("Attachments", [])
                if a.get("State") in ("attaching", "attached")]
    tags = {t["Key"]: t["Value"] for t in d.get("Tags", [])}
    return BlockVolume(d["VolumeId"], name, d["AvailabilityZone"], int(d["Size"]), d["State"],
                       attached[0] if attached else None, created,
                       never_formatted=tags.get(TAG_FORMATTED) == "false")


def _describe(ec2: Any, name: str) -> list[dict[str, Any]]:
    pages = ec2.get_paginator("describe_volumes").paginate(
        Filters=[{"Name": f"tag:{TAG_VOLUME}", "Values": [name]}])
    return [v for page in pages for v in page["Volumes"]
            if v["State"] not in ("deleting", "deleted", "error")]


def find_block_volume(ec2: Any, name: str) -> BlockVolume | None:
    """The EBS volume tagged ``flow:volume=name``; VolumeError when several are."""
    VolumeSpec(name=name, interface="block")
    found = _describe(ec2, name)
    if len(found) > 1:
        ids = ", ".join(v["VolumeId"] for v in found)
        raise VolumeError(f"several EBS volumes are tagged {TAG_VOLUME}={name} ({ids}); "
                          "keep the tag on one")
    return _volume(found[0], name) if found else None


def block_volume_zone(ec2: Any, name: str) -> str | None:
    """The zone an existing block volume lives in (launch the node there), else None."""
    found = find_block_volume(ec2, name)
    return found.zone if found else None


def _wait(ec2: Any, volume_id: str, ready: tuple[str, ...], timeout_s: float, poll_s: float
          ) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        d = ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"][0]
        if d["State"] in ready:
            return dict(d)
        if d["State"] == "error" or time.monotonic() >= deadline:
            raise VolumeError(f"EBS volume {volume_id} is {d['State']}, not {'/'.join(ready)}"
                              f" (waited {timeout_s:.0f}s at most)")
        time.sleep(poll_s)


def ensure_block_volume(ec2: Any, volume: VolumeSpec, zone: str, *, timeout_s: float = 300.0,
                        poll_s: float = 2.0) -> BlockVolume:
    """Find or create (gp3, encrypted) the EBS volume of ``volume`` in ``zone``; wait until
    it can be attached. Raises VolumeError when it lives in another zone."""
    if volume.interface != "block":
        raise VolumeError(f"volume {volume.name!r} has interface={volume.interface!r}; EBS "
                          "serves interface='block' volumes")
    found = find_block_volume(ec2, volume.name)
    created = False
    if found is None:
        tags = [{"Key": "Name", "Value": volume.name}, {"Key": TAG_VOLUME, "Value": volume.name},
                {"Key": TAG_FORMATTED, "Value": "false"}]
        description = ec2.create_volume(
            AvailabilityZone=zone, Size=volume.size_gb, VolumeType="gp3", Encrypted=True,
            TagSpecifications=[{"ResourceType": "volume", "Tags": tags}])
        found, created = _volume(description, volume.name), True
    if found.zone != zone:
        raise VolumeError(f"block volume {volume.name!r} ({found.volume_id}) lives in {found.zone}, "
                          f"not {zone}; an EBS volume attaches only in its own zone: launch the "
                          "task there")
    if found.attached_to is not None:
        raise VolumeInUseError(f"block volume {volume.name!r} ({found.volume_id}) is attached "
                               f"to {found.attached_to}; a block volume attaches to one node at "
                               "a time")
    ready = _wait(ec2, found.volume_id, ("available",), timeout_s, poll_s)
    return _volume(ready, volume.name, created)


def attach_block_volume(ec2: Any, volume_id: str, instance_id: str, device: str = DEVICES[0],
                        *, timeout_s: float = 300.0, poll_s: float = 2.0) -> None:
    """Attach the volume to the node and wait until it is attached."""
    try:
        ec2.attach_volume(VolumeId=volume_id, InstanceId=instance_id, Device=device)
    except ClientError as exc:
        raise VolumeError(f"could not attach EBS volume {volume_id} to {instance_id} at "
                          f"{device}: {exc}") from exc
    _wait(ec2, volume_id, ("in-use",), timeout_s, poll_s)


_MOUNT_FUNCTION = """flow_has_fs() {  # device: blkid finds a file system, asked 3 times
  local i
  for i in 1 2 3; do
    if blkid "$1" >/dev/null 2>&1; then return 0; fi
    if [ "$i" -lt 3 ]; then sleep 1; fi
  done
  return 1
}
flow_mount_ebs() {  # volume id, device, mount path, fresh|keep
  local serial="${1//-/}" dev="" tries
  for attempt in $(seq 1 120); do
    for candidate in "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_${serial}" \\
        "$2" "${2/\\/dev\\/sd//dev/xvd}"; do
      if [ -b "$candidate" ]; then dev="$candidate"; break 2; fi
    done
    sleep 5
  done
  if [ -z "$dev" ]; then echo "flow bootstrap: EBS volume $1 never appeared" >&2; return 1; fi
  if [ "$4" = fresh ] && ! flow_has_fs "$dev"; then  # one failed blkid is not "blank"
    mkfs.ext4 -q "$dev"
    aws ec2 create-tags --region "$FLOW_NODE_REGION" --resources "$1" \\
      --tags Key=flow:formatted,Value=true \\
      || echo "flow bootstrap: EBS volume $1 is formatted but still tagged" \\
        "flow:formatted=false (ec2:CreateTags was refused)" >&2
  else
    tries=0
    until blkid "$dev" >/dev/null 2>&1; do
      tries=$((tries + 1))
      if [ "$tries" -ge 8 ]; then
        echo "flow bootstrap: EBS volume $1 has no file system that blkid can read, and flow" \\
          "did not create it blank (no flow:formatted=false tag), so it may hold data: it" \\
          "was not formatted; format it yourself, or use a volume flow creates" >&2
        return 1
      fi
      sleep 1
    done
  fi
  mkdir -p "$3"
  mount "$dev" "$3"
}"""


def mount_script(mounts: Mapping[str, BlockVolume]) -> str:
    """Bash lines that wait for each attached volume and mount it at its path
    (``{path: volume}``, attached at ``DEVICES`` in sorted path order). Empty for none."""
    if not mounts:
        return ""
    if len(mounts) > len(DEVICES):
        raise VolumeError(f"at most {len(DEVICES)} block volumes per node")
    lines = [_MOUNT_FUNCTION]
    for device, (path, volume) in zip(DEVICES, sorted(mounts.items())):
        lines.append(f"flow_mount_ebs {shlex.quote(volume.volume_id)} {shlex.quote(device)} "
                     f"{shlex.quote(path)} {'fresh' if volume.never_formatted else 'keep'}")
    return "\n".join(lines) + "\n"


def list_block_volumes(ec2: Any) -> list[BlockVolume]:
    """Every EBS volume tagged as a flow volume."""
    pages = ec2.get_paginator("describe_volumes").paginate(
        Filters=[{"Name": "tag-key", "Values": [TAG_VOLUME]}])
    found = []
    for page in pages:
        for d in page["Volumes"]:
            name = {t["Key"]: t["Value"] for t in d.get("Tags", [])}.get(TAG_VOLUME)
            if name and d["State"] not in ("deleting", "deleted"):
                found.append(_volume(d, name))
    return sorted(found, key=lambda v: v.name)


def delete_block_volume(ec2: Any, name: str) -> bool:
    """Delete the EBS volume of ``name``; False when there is none. Refuses one attached."""
    found = find_block_volume(ec2, name)
    if found is None:
        return False
    if found.attached_to is not None:
        raise VolumeInUseError(f"block volume {name!r} ({found.volume_id}) is attached to "
                               f"{found.attached_to}; stop that task first")
    ec2.delete_volume(VolumeId=found.volume_id)
    return True
