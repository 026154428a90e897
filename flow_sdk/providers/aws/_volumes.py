"""``AwsProvider.volumes``: file volumes are EFS file systems (``_efs``), block volumes EBS
volumes (``_ebs``), found by their ``flow:volume`` tag in the provider's home region.

Besides the ``Volumes`` calls, the launch uses it per attempt: ``provision`` finds or creates
the task's volumes where the attempt lands and returns the user-data lines that mount them,
``attach_blocks`` attaches block volumes once the node exists, and ``remount`` gives a
replacement node the gang's mount lines. On a node the bootstrap has mounted every volume
before the agent starts, so ``node_mounts`` only checks they are there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from flow_sdk.errors import FieldProblem, ProviderError, ValidationError, VolumeError
from flow_sdk.providers.aws import _ebs, _efs
from flow_sdk.providers.aws._clients import Clients
from flow_sdk.providers.aws._resources import RegionContext
from flow_sdk.providers.base import Log, NodeMount, VolumeInfo, Volumes
from flow_sdk.spec import TaskSpec, VolumeSpec


class AwsVolumes(Volumes):
    """EFS and EBS volumes of one account, in ``region`` (the provider's home region); each
    says it lives on ``provider`` (the provider's registered name)."""

    def __init__(self, clients: Clients, region: str, provider: str = "aws") -> None:
        self.clients = clients
        self.region = region
        self.provider = provider

    def _efs(self, region: str | None = None) -> Any:
        return self.clients.get("efs", region or self.region)

    def _ec2(self, region: str | None = None) -> Any:
        return self.clients.get("ec2", region or self.region)

    # -- Volumes ---------------------------------------------------------------------------

    def list(self) -> list[VolumeInfo]:
        infos = [VolumeInfo(f.name, "file", f.size_gb, self.provider, f.file_system_id,
                            self.region)
                 for f in _efs.list_file_systems(self._efs())]
        infos += [VolumeInfo(v.name, "block", v.size_gb, self.provider, v.volume_id,
                             self.region, in_use_by=(v.attached_to,) if v.attached_to else ())
                  for v in _ebs.list_block_volumes(self._ec2())]
        return sorted(infos, key=lambda i: (i.name, i.interface))

    def ensure(self, spec: VolumeSpec, *, zone: str | None = None) -> VolumeInfo:
        if spec.interface == "file":
            fs = _efs.ensure_file_system(self._efs(), spec)
            return VolumeInfo(fs.name, "file", fs.size_gb, self.provider, fs.file_system_id,
                              self.region)
        if not zone:
            raise ValidationError([FieldProblem("zone", "an EBS (block) volume lives in one "
                                                        "availability zone: pass zone=...")])
        vol = _ebs.ensure_block_volume(self._ec2(), spec, zone)
        return VolumeInfo(vol.name, "block", vol.size_gb, self.provider, vol.volume_id,
                          self.region)

    def delete(self, name: str, *, force: bool = False) -> bool:
        """EFS refuses to go while mounted and an attached EBS volume is kept, so ``force``
        changes nothing here."""
        deleted = _efs.delete_file_system(self._efs(), name)
        return _ebs.delete_block_volume(self._ec2(), name) or deleted

    def node_mounts(self, spec: TaskSpec, task_id: str, log: Log) -> list[NodeMount]:
        mounts = []
        for path, volume in sorted(spec.volumes.items()):
            origin = f"volume {volume.name} ({volume.interface})"
            if not os.path.ismount(path):
                raise VolumeError(f"{origin} is not mounted at {path} on this node; the aws "
                                  "bootstrap mounts volumes before the agent starts: check the "
                                  "node's boot log")
            log(f"volume {volume.name!r} ({volume.interface}) at {path}: mounted at boot")
            mounts.append(NodeMount(path, Path(path), False, origin,
                                    premounted=True))
        return mounts

    # -- what a launch attempt needs -------------------------------------------------------

    @staticmethod
    def block_zone(ctx: RegionContext, task_id: str, names: list[str]) -> str | None:
        """The zone the task's existing block volumes live in (the node must launch there),
        None when none exists yet in this region."""
        zones = {_ebs.block_volume_zone(ctx.ec2, name) for name in names} - {None}
        if len(zones) > 1:
            raise ProviderError(f"the block volumes {names} of task {task_id} live in "
                                f"different zones ({sorted(map(str, zones))}) of {ctx.region}; "
                                "one node can attach them only in one zone")
        return str(zones.pop()) if zones else None

    def provision(self, ctx: RegionContext, spec: TaskSpec, zone: str, subnet_id: str,
                  security_group: str) -> str:
        """Before an attempt: the task's EFS file systems (found or created) with a mount
        target in ``subnet_id`` open to the nodes' group, and its EBS volumes (found or
        created in ``zone``). Returns the user-data lines that mount them (the block volumes
        are attached once the node exists: ``attach_blocks``)."""
        if not spec.volumes:
            return ""
        mounts_sh = _efs.provision_file_volumes(
            self._efs(ctx.region), ctx.ec2, spec.volumes, subnet_ids=[subnet_id],
            node_security_group=security_group)
        blocks = {path: _ebs.ensure_block_volume(ctx.ec2, volume, zone)
                  for path, volume in spec.volumes.items() if volume.interface == "block"}
        return mounts_sh + _ebs.mount_script(blocks)

    @staticmethod
    def attach_blocks(ctx: RegionContext, spec: TaskSpec, task_id: str,
                      instances: list[dict[str, Any]]) -> None:
        """Attach the task's block volumes to its (single) node, at the devices the user-data
        waits for (``_ebs.DEVICES`` in sorted path order)."""
        blocks = {p: v for p, v in spec.volumes.items() if v.interface == "block"}
        if not blocks:
            return
        if len(instances) != 1:
            raise ProviderError(f"block volumes attach to one node, but task {task_id} "
                                f"started {len(instances)}")
        instance_id = str(instances[0]["InstanceId"])
        for device, (path, volume) in zip(_ebs.DEVICES, sorted(blocks.items())):
            found = _ebs.find_block_volume(ctx.ec2, volume.name)
            if found is None:
                raise ProviderError(f"block volume {volume.name!r} for {path} vanished before "
                                    f"it could be attached to {instance_id}")
            _ebs.attach_block_volume(ctx.ec2, found.volume_id, instance_id, device)

    def remount(self, task_id: str, spec: TaskSpec, region: str) -> str:
        """The mount lines of a replacement node: the gang's EFS file systems, which exist
        (the launch provisioned them, with mount targets in every zone it tried). A block
        volume stays with the node it is attached to, so such a task is not replaced."""
        blocks = sorted(v.name for v in spec.volumes.values() if v.interface == "block")
        if blocks:
            raise ProviderError(f"task {task_id} has block volume(s) {blocks}, which attach to "
                                "one node only; a lost node is not replaced: launch the task "
                                "again")
        found: dict[str, _efs.FileSystem] = {}
        for path, volume in spec.volumes.items():
            try:
                fs = _efs.find_file_system(self._efs(region), volume.name)
            except VolumeError as exc:
                raise ProviderError(f"cannot mount {path} on a replacement node of task "
                                    f"{task_id}: {exc}") from exc
            if fs is None:
                raise ProviderError(f"the EFS file system of volume {volume.name!r} ({path}) "
                                    f"of task {task_id} is gone from {region}; no replacement "
                                    "node was started")
            found[path] = fs
        return _efs.mount_script(found)


def sample_mounts(spec: TaskSpec) -> str:
    """Mount lines as long as the real ones will be (longest ids), to size the user-data."""
    files = {p: _efs.FileSystem("fs-" + "f" * 17, v.name, "ap-southeast-3", "available",
                                v.size_gb)
             for p, v in spec.volumes.items() if v.interface == "file"}
    blocks = {p: _ebs.BlockVolume("vol-" + "f" * 17, v.name, "ap-southeast-3a", v.size_gb,
                                  "available", None, never_formatted=True)
              for p, v in spec.volumes.items() if v.interface == "block"}
    return _efs.mount_script(files) + _ebs.mount_script(blocks)
