"""The node's instance metadata service (IMDSv2), for spot interruption notices.

IMDSv2 only: a session token from ``PUT /latest/api/token`` goes with every read (the nodes are
launched with ``HttpTokens=required``, so a read without it is refused with 401). The token is
cached for its lifetime, so a poll every few seconds costs one local GET; a 401 (the token
expired or IMDS restarted) fetches a new one once.
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse

from flow_sdk.errors import ProviderError

IMDS_ENDPOINT = "http://169.254.169.254"  # the instance metadata service, IMDSv2 only
TOKEN_PATH = "/latest/api/token"
SPOT_ACTION_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_TTL_S = 21600  # the longest IMDS grants
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TIMEOUT_S = 1.0  # IMDS is on the host: a slower answer means it is not there
_RENEW_BEFORE_S = 60.0


class ImdsClient:
    """Reads one metadata service; thread-safe."""

    def __init__(self, endpoint: str) -> None:
        parsed = urllib.parse.urlsplit(endpoint)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ProviderError(f"imds_endpoint {endpoint!r} must be an http:// URL such as "
                                "'http://169.254.169.254'")
        self.endpoint = endpoint
        self._host = parsed.hostname
        self._port = parsed.port or 80
        self._base = parsed.path.rstrip("/")
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires = 0.0

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=TIMEOUT_S)
        try:
            conn.request(method, self._base + path, headers=headers)
            response = conn.getresponse()
            return response.status, response.read().decode("utf-8", errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            raise ProviderError(f"the instance metadata service at {self.endpoint} did not "
                                f"answer {method} {path} ({exc}); on EC2 check the instance's "
                                "metadata options (HttpEndpoint enabled); elsewhere set "
                                "provider_config imds_endpoint") from exc
        finally:
            conn.close()

    def _fresh_token(self) -> str:
        status, body = self._request("PUT", TOKEN_PATH, {TTL_HEADER: str(TOKEN_TTL_S)})
        if status != 200 or not body:
            raise ProviderError(f"the instance metadata service at {self.endpoint} refused a "
                                f"session token (HTTP {status}: {body[:200]!r})")
        self._token = body.strip()
        self._expires = time.monotonic() + TOKEN_TTL_S - _RENEW_BEFORE_S
        return self._token

    def _token_now(self) -> str:
        if self._token is None or time.monotonic() >= self._expires:
            return self._fresh_token()
        return self._token

    def get(self, path: str) -> str | None:
        """The metadata at ``path``, or None when IMDS has none (HTTP 404)."""
        with self._lock:
            status, body = self._request("GET", path, {TOKEN_HEADER: self._token_now()})
            if status == 401:  # the token expired early, or IMDS restarted
                status, body = self._request("GET", path, {TOKEN_HEADER: self._fresh_token()})
        if status == 404:
            return None
        if status != 200:
            raise ProviderError(f"the instance metadata service at {self.endpoint} answered "
                                f"GET {path} with HTTP {status}: {body[:200]!r}")
        return body
