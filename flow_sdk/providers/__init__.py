"""Providers behind one interface. Built-ins: ``local`` (default), ``aws`` and ``aws-sim`` (the
simulated cloud, ``flow_sdk.sim``: named here by string, never imported); more plug in
through the ``flow_sdk.providers`` entry-point group."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from flow_sdk.errors import ProviderError, install_hint
from flow_sdk.providers.base import (
    Instance,
    LaunchRequest,
    LogRecord,
    LogStore,
    ObjectStore,
    Provider,
)

# What a built-in provider needs beyond the SDK's own dependencies (by index name).
_PACKAGES = {"aws": ("boto3",)}
_BUILTIN = {
    "local": "flow_sdk.providers.local:LocalProvider",
    "aws": "flow_sdk.providers.aws:AwsProvider",
    "aws-sim": "flow_sdk.sim:AwsSimProvider",
}


def _targets() -> dict[str, str]:
    targets = {ep.name: ep.value for ep in entry_points(group="flow_sdk.providers")}
    targets.update(_BUILTIN)  # built-ins cannot be shadowed by a plug-in
    return targets


def available_providers() -> list[str]:
    return sorted(_targets())


def provider_class(name: str) -> type[Provider]:
    target = _targets().get(name)
    if target is None:
        raise ProviderError(f"unknown provider {name!r}; available: {', '.join(available_providers())}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        needs = _PACKAGES.get(name)
        hint = f"; {install_hint(f'the {name} provider', *needs)}" if needs else ""
        raise ProviderError(f"provider {name!r} cannot be loaded: {exc}{hint}") from exc
    cls = getattr(module, attr)
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise ProviderError(f"{target} is not a flow_sdk Provider")
    return cls


def get_provider(name: str, config: Mapping[str, Any] | None = None) -> Provider:
    """The provider ``name``, rebuilt from ``config`` when given, else with its defaults."""
    cls = provider_class(name)
    return cls.from_config(config) if config is not None else cls.from_config({})


def attach_provider(name: str, config: Mapping[str, Any] | None = None) -> Provider:
    """``get_provider`` for reading what already runs: it starts no service
    (``Provider.attach``)."""
    return provider_class(name).attach(config if config is not None else {})


__all__ = ["Instance", "LaunchRequest", "LogRecord", "LogStore", "ObjectStore", "Provider",
           "attach_provider", "available_providers", "get_provider", "provider_class"]
