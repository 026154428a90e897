"""The chaos run's simulated account as the harness reaches it directly, past the fault
proxy: its server's address and home, whose key file signs every request (the account refuses
whoever lacks its keys)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from flow_sdk.sim._access import KEYS_FILE, read_keys

REGION = "us-east-1"


@dataclass(frozen=True)
class Account:
    url: str
    home: Path

    def client(self, service: str) -> Any:
        keys = read_keys(self.home / KEYS_FILE)
        return boto3.client(service, region_name=REGION, endpoint_url=self.url,
                            aws_access_key_id=keys.access_key_id,
                            aws_secret_access_key=keys.secret_access_key)

    def provider_config(self, url: str) -> dict[str, Any]:
        """What an ``aws-sim`` provider_config needs to reach this account at ``url`` (the
        account itself, or the fault proxy in front of it)."""
        return {"endpoint_url": url, "account_home": str(self.home)}
