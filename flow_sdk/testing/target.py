"""The provider a contract run checks: its name and the ``provider_config`` it launches with."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from flow_sdk.client.app import FlowApp
from flow_sdk.providers import get_provider
from flow_sdk.providers.base import Provider


# Within it, the provider gets only part of a gang it launches: the first node starts, the
# others fail to (a cloud out of capacity, a machine out of processes).
PartialLaunch = Callable[[], AbstractContextManager[object]]


@dataclass(frozen=True)
class ProviderUnderTest:
    """A provider by name (``provider=``) and its ``provider_config`` (None: its defaults).
    ``partial_launch`` arranges a launch that gets part of its gang, for the all-or-none
    test; without it that test fails, saying what to give."""

    name: str
    config: Mapping[str, Any] | None = field(default=None)
    partial_launch: PartialLaunch | None = field(default=None)

    def _config(self) -> dict[str, Any] | None:
        return None if self.config is None else dict(self.config)

    def provider(self) -> Provider:
        return get_provider(self.name, self._config())

    def app(self, label: str) -> FlowApp:
        return FlowApp(label, provider=self.name, provider_config=self._config())
