"""The one way flow-sdk builds boto3 clients, and the one region rule.

Low in the layers (boto3 is imported when a client is made, never at import time), so the aws
provider, S3 mounts on the nodes and the data connector all use it without importing each
other. Region rule: the region the caller names, else ``AWS_REGION``, else
``AWS_DEFAULT_REGION``, else ``us-east-1``.
"""

from __future__ import annotations

import os
import re
from typing import Any

REGION_RE = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-\d+$")  # e.g. us-east-1, ap-southeast-3
FALLBACK_REGION = "us-east-1"


def default_region(explicit: str | None = None) -> str:
    """The region to use: ``explicit``, else the environment's, else ``us-east-1``."""
    return (explicit or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            or FALLBACK_REGION)


def make_client(service: str, region: str | None = None, *, endpoint_url: str | None = None,
                session: Any = None, retries: dict[str, Any] | None = None,
                max_pool_connections: int = 32) -> Any:
    """A boto3 client for ``service`` in ``region`` (the region rule when None).

    ``endpoint_url`` (e.g. a moto server) applies to the service, and S3 then uses path-style
    addressing, since such servers rarely resolve bucket sub-domains. ``session`` is a boto3
    Session (a fresh one when None); ``retries`` botocore's retry settings (standard mode, 6
    attempts when None). Credentials come from the standard chain, never from here."""
    import boto3
    from botocore.config import Config

    config = Config(retries=retries or {"mode": "standard", "max_attempts": 6},
                    connect_timeout=10, read_timeout=60,
                    max_pool_connections=max_pool_connections,
                    s3={"addressing_style": "path"} if endpoint_url else None)
    chosen: Any = session if session is not None else boto3.session.Session()
    return chosen.client(service, region_name=default_region(region),
                         endpoint_url=endpoint_url, config=config)
