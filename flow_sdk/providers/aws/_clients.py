"""boto3 clients for one provider: one session, one client per (service, region, purpose),
each made by ``flow_sdk.aws_clients.make_client``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from botocore.exceptions import ClientError

from flow_sdk.aws_clients import make_client

_GENERAL: Any = {"mode": "standard", "max_attempts": 6}
# run_instances gets no botocore retries: the launcher retries transient errors itself with
# the same ClientToken and treats capacity errors (HTTP 500 on AWS) as "try the next offer".
_LAUNCH: Any = {"mode": "standard", "total_max_attempts": 1}


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


@contextmanager
def tolerating(*codes: str) -> Iterator[None]:
    """Let a call fail with one of ``codes`` (it found the state it was after: the resource
    already exists, is already gone, already holds the role); any other error propagates."""
    try:
        yield
    except ClientError as exc:
        if error_code(exc) not in codes:
            raise


def error_message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", "")) or str(exc)


def http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


class Clients:
    """Thread-safe cache of boto3 clients; ``endpoint_url`` (an AWS-compatible endpoint)
    applies to every service."""

    def __init__(self, endpoint_url: str | None, session: boto3.session.Session | None = None
                 ) -> None:
        self.endpoint_url = endpoint_url
        self.session = session if session is not None else boto3.session.Session()
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str, bool], Any] = {}

    def get(self, service: str, region: str, *, launch: bool = False) -> Any:
        """The client for ``service`` in ``region``; ``launch=True``: no automatic retries."""
        key = (service, region, launch)
        with self._lock:
            client = self._cache.get(key)
            if client is None:
                client = make_client(service, region, endpoint_url=self.endpoint_url,
                                     session=self.session,
                                     retries=_LAUNCH if launch else _GENERAL)
                self._cache[key] = client
            return client
