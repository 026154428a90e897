"""An instance metadata service (IMDSv2) for one simulated instance, on loopback.

A simulated node reaches it the way AWS SDKs and tools allow an endpoint override
(``AWS_EC2_METADATA_SERVICE_ENDPOINT``): nothing on this machine ever talks to 169.254.169.254.
It answers as EC2's does with ``HttpTokens=required``: ``PUT /latest/api/token`` (with a TTL
header of 1-21600 s) hands out a session token, and every ``GET /latest/meta-data/...``
without a valid token is refused with 401; unknown paths are 404.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_PATH = "/latest/api/token"
META_PREFIX = "/latest/meta-data/"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TTL_S = 21600


class ImdsEmulator:
    """Serves ``metadata`` (path under ``/latest/meta-data/`` -> value) on 127.0.0.1."""

    def __init__(self, metadata: Mapping[str, str], host: str = "127.0.0.1") -> None:
        self.metadata = dict(metadata)
        self._tokens: dict[str, float] = {}  # token -> expiry (monotonic)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="imds-emulator")

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> str:
        self._thread.start()
        return self.endpoint

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _issue(self, ttl_s: int) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._tokens[token] = time.monotonic() + ttl_s
        return token

    def _valid(self, token: str | None) -> bool:
        if not token:
            return False
        with self._lock:
            expiry = self._tokens.get(token)
        return expiry is not None and time.monotonic() < expiry

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return None  # the node's boot log has what matters

            def _answer(self, status: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path != TOKEN_PATH:
                    self._answer(404)
                    return
                ttl = self.headers.get(TTL_HEADER, "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= MAX_TTL_S:
                    self._answer(400, f"{TTL_HEADER} must be 1-{MAX_TTL_S}")
                    return
                self._answer(200, imds._issue(int(ttl)))

            def do_GET(self) -> None:  # noqa: N802
                if not imds._valid(self.headers.get(TOKEN_HEADER)):
                    self._answer(401)
                    return
                if not self.path.startswith(META_PREFIX):
                    self._answer(404)
                    return
                value = imds.metadata.get(self.path[len(META_PREFIX):])
                if value is None:
                    self._answer(404)
                else:
                    self._answer(200, value)

        return Handler
