"""Providers behind one interface. Built-ins: ``local`` (default), ``aws``, ``slurm`` and
``aws-sim`` (the simulated cloud, ``flow_sdk.sim``: named here by string, never imported);
more plug in through the ``flow_sdk.providers`` entry-point group, where the built-ins are
registered too.

A provider's module is imported only when a task or command uses it. A plug-in never hides a
built-in (its entry under a built-in's name is reported and left out); one registered twice
with the same class counts once; a plug-in that cannot be loaded, or that two distributions
register with different classes, is a ``ProviderError`` naming its distribution when it is
used, and never stops the others from being listed or used."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from flow_sdk.errors import ProviderError, ProviderWarning, install_hint
from flow_sdk.providers.base import (
    Instance,
    LaunchRequest,
    LogRecord,
    LogStore,
    ObjectStore,
    Provider,
)

GROUP = "flow_sdk.providers"  # the entry-point group providers register in
# What a built-in provider needs beyond the SDK's own dependencies (by index name).
_PACKAGES = {"aws": ("boto3",)}
# The built-ins, also registered in GROUP (pyproject.toml): this table serves when the SDK runs
# from a source folder without its distribution's metadata, and no plug-in can take a name here.
_BUILTIN = {
    "local": "flow_sdk.providers.local:LocalProvider",
    "aws": "flow_sdk.providers.aws:AwsProvider",
    "aws-sim": "flow_sdk.sim:AwsSimProvider",
    "slurm": "flow_sdk.providers.slurm:SlurmProvider",
}


@dataclass(frozen=True)
class _Entry:
    """Where a provider's class is (``module:attribute``) and which distribution says so."""

    target: str
    distribution: str


def _entries() -> dict[str, list[_Entry]]:
    """Every provider by name: the built-ins, then the group's entry points, each distinct
    (name, target) once (an editable install can list its distribution twice). A plug-in's
    entry under a built-in's name is reported and left out: it never hides the built-in."""
    found: dict[str, list[_Entry]] = {name: [_Entry(target, "the SDK itself")]
                                      for name, target in _BUILTIN.items()}
    for ep in entry_points(group=GROUP):
        dist = ep.dist.name if ep.dist is not None else "an unnamed distribution"
        if ep.name in _BUILTIN:
            if ep.value != _BUILTIN[ep.name]:
                warnings.warn(ProviderWarning(
                    f"{dist} registers a provider named {ep.name!r} ({ep.value}); that is a "
                    f"built-in provider's name, so it is ignored: rename the entry point in "
                    f"{dist}'s {GROUP!r} group"), stacklevel=3)
            continue
        entries = found.setdefault(ep.name, [])
        if all(entry.target != ep.value for entry in entries):
            entries.append(_Entry(ep.value, dist))
    return found


def available_providers() -> list[str]:
    """The names a task may use as ``provider=`` (nothing is imported to list them)."""
    return sorted(_entries())


def _entry(name: str) -> _Entry:
    entries = _entries().get(name)
    if entries is None:
        raise ProviderError(f"unknown provider {name!r}; available: "
                            f"{', '.join(available_providers())}")
    if len(entries) > 1:
        listed = "; ".join(f"{e.distribution} ({e.target})" for e in entries)
        raise ProviderError(f"provider {name!r} is registered by more than one installed "
                            f"distribution with different classes: {listed}; uninstall all "
                            "but one")
    return entries[0]


def plugin_source(name: str) -> tuple[str, tuple[str, ...]] | None:
    """Where the plug-in provider ``name`` comes from: its distribution and the top-level
    packages its entry points in the group name (what its nodes must import too); None for a
    built-in (the SDK's own wheel carries it)."""
    entry = _entry(name)
    if name in _BUILTIN:
        return None
    packages = sorted({ep.value.split(":")[0].split(".")[0]
                       for ep in entry_points(group=GROUP)
                       if ep.dist is not None and ep.dist.name == entry.distribution})
    return entry.distribution, tuple(packages)


def provider_class(name: str) -> type[Provider]:
    entry = _entry(name)
    module_name, _, attr = entry.target.partition(":")
    try:  # the attribute too: a package that exports its names lazily imports on access
        module = importlib.import_module(module_name)
        cls = getattr(module, attr, None) if attr else None
    except Exception as exc:  # a plug-in's module may fail in any way: reported, typed
        needs = _PACKAGES.get(name) if isinstance(exc, ImportError) else None
        hint = f"; {install_hint(f'the {name} provider', *needs)}" if needs else ""
        raise ProviderError(f"provider {name!r} ({entry.target}, from {entry.distribution}) "
                            f"cannot be loaded: {exc}{hint}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise ProviderError(f"provider {name!r}: {entry.target} (from {entry.distribution}) "
                            "is not a flow_sdk Provider class; fix the entry point in its "
                            f"{GROUP!r} group")
    return cls


def get_provider(name: str, config: Mapping[str, Any] | None = None) -> Provider:
    """The provider ``name``, rebuilt from ``config`` when given, else with its defaults."""
    cls = provider_class(name)
    return cls.from_config(config) if config is not None else cls.from_config({})


def attach_provider(name: str, config: Mapping[str, Any] | None = None) -> Provider:
    """``get_provider`` for reading what already runs: it starts no service
    (``Provider.attach``)."""
    return provider_class(name).attach(config if config is not None else {})


__all__ = ["GROUP", "Instance", "LaunchRequest", "LogRecord", "LogStore", "ObjectStore",
           "Provider", "attach_provider", "available_providers", "get_provider", "plugin_source",
           "provider_class"]
