"""Named volumes in the Python API (``Volume``) and the functions ``flow volumes`` calls.

    ckpt = Volume("ckpt", size_gb=500)                 # interface="file": every node
    @app.function(num_instances=4, volumes={"/shared/ckpt": ckpt})
    def train(): ...

    Volume.list(); ckpt.create(); ckpt.exists(); ckpt.delete()
    list_volumes(); create_volume("ckpt", 500); delete_volume("ckpt")   # what the CLI calls

``local`` volumes are directories under the flow data dir (``flow_sdk.volumes.local``); on
``aws`` a file volume is an EFS file system and a block volume an EBS volume (found by their
``flow:volume`` tag, in ``region`` or the provider config's region). Names, sizes and
interfaces are validated like ``@app.function``'s; bad input raises ``ValidationError`` and
creates nothing.
"""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic

from flow_sdk import protocol
from flow_sdk.errors import FieldProblem, ProviderError, ValidationError
from flow_sdk.providers import get_provider
from flow_sdk.providers.base import Provider
from flow_sdk.spec import VolumeSpec
from flow_sdk.volumes.errors import VolumeError, VolumeInUseError
from flow_sdk.volumes.local import LocalVolumes
from flow_sdk.volumes.node import LOCAL_PROVIDERS, provider_root

ProviderConfig = Mapping[str, Any] | None


@dataclass(frozen=True)
class VolumeInfo:
    """A volume as its provider reports it."""

    name: str
    interface: str
    size_gb: int | None
    provider: str
    location: str  # local directory, EFS file system id or EBS volume id
    region: str | None = None
    created_at: float | None = None
    in_use_by: tuple[str, ...] = ()  # tasks or instances using it now


def volume_spec(name: str, size_gb: int = 100, interface: str = "file") -> VolumeSpec:
    """A validated VolumeSpec; ValidationError (naming the field) on bad input."""
    try:
        return VolumeSpec(name=name, size_gb=size_gb, interface=interface)  # type: ignore[arg-type]
    except pydantic.ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = ".".join(str(p) for p in ("volume", *error["loc"]))
            message = error["msg"].removeprefix("Value error, ")
            problems.append(FieldProblem(field, message))
        raise ValidationError(problems) from None


def _provider(provider: str, config: ProviderConfig) -> Provider:
    try:
        return get_provider(provider, dict(config) if config is not None else None)
    except ProviderError as exc:
        raise ValidationError([FieldProblem("provider", str(exc))]) from None


# -- local -------------------------------------------------------------------------------


def _running_tasks_using(provider: Provider, name: str) -> tuple[str, ...]:
    """Tasks of this provider with no outcome yet, a live node, and volume ``name``."""
    users = []
    for key in provider.store.list("tasks/"):
        if not key.endswith("/task.json"):
            continue
        task_id = key.split("/")[1]
        if provider.store.exists(protocol.outcome_key(task_id)):
            continue
        raw = provider.store.get(key)
        if raw is None:
            continue
        volumes = json.loads(raw).get("spec", {}).get("volumes", {})
        if any(v.get("name") == name for v in volumes.values()) and any(
                i.state != "terminated" for i in provider.list_instances(task_id)):
            users.append(task_id)
    return tuple(users)


def _local_info(provider: Provider, volumes: LocalVolumes, name: str) -> VolumeInfo | None:
    found = volumes.get(name)
    if found is None:
        return None
    return VolumeInfo(found.name, found.interface, found.size_gb, provider.name,
                      str(found.data), None, found.created_at,
                      _running_tasks_using(provider, found.name))


# -- aws ---------------------------------------------------------------------------------


def _aws_clients(region: str | None, config: ProviderConfig) -> tuple[Any, Any, str]:
    try:
        import boto3
    except ImportError as exc:
        raise VolumeError("aws volumes need boto3; install flow-sdk[aws]") from exc
    cfg = dict(config or {})
    region = (region or cfg.get("region") or os.environ.get("AWS_REGION")
              or os.environ.get("AWS_DEFAULT_REGION"))
    if not region:
        raise ValidationError([FieldProblem("region", "name the AWS region of the volumes "
                                                      "(region=... or AWS_DEFAULT_REGION)")])
    session = boto3.session.Session()
    endpoint = cfg.get("endpoint_url")
    return (session.client("efs", region_name=region, endpoint_url=endpoint),
            session.client("ec2", region_name=region, endpoint_url=endpoint), region)


def _aws_list(region: str | None, config: ProviderConfig) -> list[VolumeInfo]:
    from flow_sdk.volumes import ebs, efs
    efs_client, ec2_client, region = _aws_clients(region, config)
    infos = [VolumeInfo(f.name, "file", f.size_gb, "aws", f.file_system_id, region)
             for f in efs.list_file_systems(efs_client)]
    infos += [VolumeInfo(v.name, "block", v.size_gb, "aws", v.volume_id,
                         region, in_use_by=(v.attached_to,) if v.attached_to else ())
              for v in ebs.list_block_volumes(ec2_client)]
    return sorted(infos, key=lambda i: (i.name, i.interface))


# -- the functions the CLI calls ---------------------------------------------------------


def list_volumes(provider: str = "local", *, region: str | None = None,
                 provider_config: ProviderConfig = None) -> list[VolumeInfo]:
    """Every volume of ``provider``, sorted by name."""
    if provider == "aws":
        return _aws_list(region, provider_config)
    prov = _provider(provider, provider_config)
    if prov.name not in LOCAL_PROVIDERS:
        raise ValidationError([FieldProblem("provider", f"provider {provider!r} has no volumes; "
                                                        "use 'local' or 'aws'")])
    volumes = LocalVolumes(provider_root(prov))
    return [info for v in volumes.list()
            if (info := _local_info(prov, volumes, v.name)) is not None]


def create_volume(name: str, size_gb: int = 100, interface: str = "file", *,
                  provider: str = "local", region: str | None = None, zone: str | None = None,
                  provider_config: ProviderConfig = None) -> VolumeInfo:
    """Create the volume, or return it when it exists (with the same interface).

    On aws a block volume needs ``zone`` (an EBS volume lives in one availability zone)."""
    spec = volume_spec(name, size_gb, interface)
    if provider == "aws":
        from flow_sdk.volumes import ebs, efs
        efs_client, ec2_client, region = _aws_clients(region, provider_config)
        if spec.interface == "file":
            fs = efs.ensure_file_system(efs_client, spec)
            return VolumeInfo(fs.name, "file", fs.size_gb, "aws", fs.file_system_id, region)
        if not zone:
            raise ValidationError([FieldProblem("zone", "an EBS (block) volume lives in one "
                                                        "availability zone: pass zone=...")])
        vol = ebs.ensure_block_volume(ec2_client, spec, zone)
        return VolumeInfo(vol.name, "block", vol.size_gb, "aws", vol.volume_id, region)
    prov = _provider(provider, provider_config)
    if prov.name not in LOCAL_PROVIDERS:
        raise ValidationError([FieldProblem("provider", f"provider {provider!r} has no volumes; "
                                                        "use 'local' or 'aws'")])
    volumes = LocalVolumes(provider_root(prov))
    volumes.ensure(spec)
    info = _local_info(prov, volumes, spec.name)
    assert info is not None
    return info


def delete_volume(name: str, *, provider: str = "local", region: str | None = None,
                  provider_config: ProviderConfig = None, force: bool = False) -> bool:
    """Delete the volume and its data; False when there is none. A volume a running task
    uses is kept (VolumeInUseError) unless ``force``; an attached block volume always is."""
    spec = volume_spec(name)
    if provider == "aws":
        from flow_sdk.volumes import ebs, efs
        efs_client, ec2_client, _ = _aws_clients(region, provider_config)
        deleted = efs.delete_file_system(efs_client, spec.name)
        return ebs.delete_block_volume(ec2_client, spec.name) or deleted
    prov = _provider(provider, provider_config)
    if prov.name not in LOCAL_PROVIDERS:
        raise ValidationError([FieldProblem("provider", f"provider {provider!r} has no volumes; "
                                                        "use 'local' or 'aws'")])
    volumes = LocalVolumes(provider_root(prov))
    if not force:
        users = _running_tasks_using(prov, spec.name)
        if users:
            raise VolumeInUseError(f"volume {spec.name!r} is used by running task(s) "
                                   f"{', '.join(users)}; cancel them or pass force=True")
    return volumes.delete(spec.name)


# -- Volume objects ----------------------------------------------------------------------


class Volume:
    """A named volume: pass it in ``volumes={path: Volume(...)}``, or manage it directly."""

    def __init__(self, name: str, size_gb: int = 100, interface: str = "file", *,
                 provider: str = "local", region: str | None = None,
                 provider_config: ProviderConfig = None) -> None:
        self.spec = volume_spec(name, size_gb, interface)
        self.provider = provider
        self.region = region
        self.provider_config = dict(provider_config) if provider_config is not None else None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def size_gb(self) -> int:
        return self.spec.size_gb

    @property
    def interface(self) -> str:
        return self.spec.interface

    def __repr__(self) -> str:
        return (f"Volume({self.name!r}, size_gb={self.size_gb}, interface={self.interface!r}, "
                f"provider={self.provider!r})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Volume) and (self.spec, self.provider, self.region) == (
            other.spec, other.provider, other.region)

    def __hash__(self) -> int:
        return hash((self.spec, self.provider, self.region))

    def to_volume_spec(self) -> VolumeSpec:
        """What ``@app.function(volumes=...)`` stores for this volume."""
        return self.spec

    def info(self) -> VolumeInfo | None:
        """The volume as its provider reports it, or None when it does not exist."""
        return next((v for v in list_volumes(self.provider, region=self.region,
                                             provider_config=self.provider_config)
                     if v.name == self.name), None)

    def exists(self) -> bool:
        return self.info() is not None

    def create(self, *, zone: str | None = None) -> VolumeInfo:
        """Create it (idempotent). Tasks also create a missing volume when they start."""
        return create_volume(self.name, self.size_gb, self.interface, provider=self.provider,
                             region=self.region, zone=zone, provider_config=self.provider_config)

    def delete(self, *, force: bool = False) -> bool:
        """Delete it and its data; see :func:`delete_volume`."""
        return delete_volume(self.name, provider=self.provider, region=self.region,
                             provider_config=self.provider_config, force=force)

    @property
    def local_path(self) -> Path:
        """A local volume's data directory on this machine (what tasks see at the mount
        path), whether or not it exists yet."""
        prov = _provider(self.provider, self.provider_config)
        if prov.name not in LOCAL_PROVIDERS:
            raise VolumeError(f"volume {self.name!r} lives on {self.provider}, not on this "
                              "machine")
        return LocalVolumes(provider_root(prov)).path(self.name) / "data"

    @classmethod
    def list(cls, provider: str = "local", *, region: str | None = None,
             provider_config: ProviderConfig = None) -> builtins.list[VolumeInfo]:
        """Every volume of ``provider``."""
        return list_volumes(provider, region=region, provider_config=provider_config)
