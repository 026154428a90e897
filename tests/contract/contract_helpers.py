"""What a contract test needs to know about a provider: its name and its provider_config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flow_sdk import FlowApp
from flow_sdk.providers import get_provider
from flow_sdk.providers.base import Provider


@dataclass(frozen=True)
class Contract:
    name: str
    config: dict[str, Any] | None

    def provider(self) -> Provider:
        return get_provider(self.name, self.config)

    def app(self, label: str) -> FlowApp:
        return FlowApp(label, provider=self.name, provider_config=self.config)
