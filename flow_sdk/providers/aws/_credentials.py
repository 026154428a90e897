"""What an aws provider config must never hold: credentials. The config is stored with
tasks and sent to every node in its user-data; nodes use their instance profile instead."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flow_sdk.errors import ProviderError

_SECRET_WORDS = ("secret", "password", "credential", "access_key", "session_token", "token")


def reject_credentials(config: Mapping[str, Any], where: str = "provider_config") -> None:
    """Raise when a key of ``config`` (at any depth) looks like a credential."""
    for key, value in config.items():
        lowered = str(key).lower()
        if any(word in lowered for word in _SECRET_WORDS):
            raise ProviderError(
                f"{where}.{key}: the aws provider config must not hold credentials (it is "
                "stored with tasks and sent to every node); remove it and use the standard AWS "
                "credential chain (environment, ~/.aws, SSO); nodes use their instance profile")
        if isinstance(value, Mapping):
            reject_credentials(value, f"{where}.{key}")
