"""Named volumes in the Python API (``Volume``) and the functions ``flow volumes`` calls.

    ckpt = Volume("ckpt", size_gb=500)                 # interface="file": every node
    @app.function(num_instances=4, volumes={"/shared/ckpt": ckpt})
    def train(): ...

    Volume.list(); ckpt.create(); ckpt.exists(); ckpt.delete()
    list_volumes(); create_volume("ckpt", 500); delete_volume("ckpt")   # what the CLI calls

Every call goes to the provider's ``Provider.volumes`` (``local``: directories under the flow
data dir; ``aws``: EFS file systems and EBS volumes in ``region`` or the provider config's
region). Names, sizes and interfaces are validated like ``@app.function``'s; bad input raises
``ValidationError`` and creates nothing.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic

from flow_sdk.errors import FieldProblem, ProviderError, ValidationError, VolumeError
from flow_sdk.providers import get_provider
from flow_sdk.providers.base import Provider, VolumeInfo, Volumes
from flow_sdk.spec import VolumeSpec

ProviderConfig = Mapping[str, Any] | None


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


def _provider(provider: str, config: ProviderConfig, region: str | None = None) -> Provider:
    settings = dict(config) if config is not None else None
    if region:
        settings = {**(settings or {}), "region": region}
    try:
        return get_provider(provider, settings)
    except ProviderError as exc:
        raise ValidationError([FieldProblem("provider", str(exc))]) from None


def _volumes(provider: str, config: ProviderConfig, region: str | None) -> Volumes:
    return _provider(provider, config, region).volumes


def list_volumes(provider: str = "local", *, region: str | None = None,
                 provider_config: ProviderConfig = None) -> list[VolumeInfo]:
    """Every volume of ``provider``, sorted by name."""
    return _volumes(provider, provider_config, region).list()


def create_volume(name: str, size_gb: int = 100, interface: str = "file", *,
                  provider: str = "local", region: str | None = None, zone: str | None = None,
                  provider_config: ProviderConfig = None) -> VolumeInfo:
    """Create the volume, or return it when it exists (with the same interface).

    On aws a block volume needs ``zone`` (an EBS volume lives in one availability zone)."""
    spec = volume_spec(name, size_gb, interface)
    return _volumes(provider, provider_config, region).ensure(spec, zone=zone)


def delete_volume(name: str, *, provider: str = "local", region: str | None = None,
                  provider_config: ProviderConfig = None, force: bool = False) -> bool:
    """Delete the volume and its data; False when there is none. A volume a running task
    uses is kept (VolumeInUseError) unless ``force``; an attached block volume always is."""
    spec = volume_spec(name)
    return _volumes(provider, provider_config, region).delete(spec.name, force=force)


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
        path = _volumes(self.provider, self.provider_config, self.region).local_path(self.name)
        if path is None:
            raise VolumeError(f"volume {self.name!r} lives on {self.provider}, not on this "
                              "machine")
        return path

    @classmethod
    def list(cls, provider: str = "local", *, region: str | None = None,
             provider_config: ProviderConfig = None) -> builtins.list[VolumeInfo]:
        """Every volume of ``provider``."""
        return list_volumes(provider, region=region, provider_config=provider_config)
