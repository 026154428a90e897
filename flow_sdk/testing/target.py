"""The provider a contract run checks: its name and the ``provider_config`` it launches with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flow_sdk.client.app import FlowApp
from flow_sdk.providers import get_provider
from flow_sdk.providers.base import Provider


@dataclass(frozen=True)
class ProviderUnderTest:
    """A provider by name (``provider=``) and its ``provider_config`` (None: its defaults)."""

    name: str
    config: Mapping[str, Any] | None = field(default=None)

    def _config(self) -> dict[str, Any] | None:
        return None if self.config is None else dict(self.config)

    def provider(self) -> Provider:
        return get_provider(self.name, self._config())

    def app(self, label: str) -> FlowApp:
        return FlowApp(label, provider=self.name, provider_config=self._config())
