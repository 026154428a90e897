"""``FakeImds``: a small IMDSv2 on 127.0.0.1 that a test points provider_config
``imds_endpoint`` at, to play spot interruption notices to simulated nodes."""

from __future__ import annotations

import http.server
import json
import secrets
import threading
import time
from typing import Any


class FakeImds:
    """A small IMDSv2 for the simulated cloud, on 127.0.0.1, that a test controls.

    ``PUT /latest/api/token`` (with the TTL header) hands out a session token; every ``GET``
    needs it in ``X-aws-ec2-metadata-token`` and gets 401 without it, as on an instance
    launched with ``HttpTokens=required``. Paths may start with ``/<instance id>``, so one
    server plays each node's own IMDS (``imds_endpoint = endpoint + "/{instance_id}"``).
    ``GET .../latest/meta-data/spot/instance-action`` is 404 until ``interrupt`` is called.
    """

    def __init__(self) -> None:
        self.notices: dict[str, str] = {}  # instance id ("" = every node) -> notice JSON
        self.tokens: set[str] = set()
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeImds is not started")
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> FakeImds:
        imds = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return  # the test reads ``requests`` instead

            def _answer(self, status: int, body: str = "") -> None:
                with imds._lock:  # recorded before the caller can see the answer
                    imds.requests.append((self.command, self.path, status))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _split(self) -> tuple[str, str]:
                parts = self.path.split("/", 2)  # "", first segment, rest
                if len(parts) == 3 and parts[1] != "latest":
                    return parts[1], "/" + parts[2]
                return "", self.path

            def do_PUT(self) -> None:
                _instance, path = self._split()
                if path != "/latest/api/token" or not self.headers.get(
                        "X-aws-ec2-metadata-token-ttl-seconds"):
                    self._answer(400, "token requests need the TTL header")
                    return
                token = secrets.token_urlsafe(24)
                with imds._lock:
                    imds.tokens.add(token)
                self._answer(200, token)

            def do_GET(self) -> None:
                instance, path = self._split()
                with imds._lock:
                    valid = self.headers.get("X-aws-ec2-metadata-token") in imds.tokens
                    notice = imds.notices.get(instance, imds.notices.get(""))
                if not valid:
                    self._answer(401)
                elif path == "/latest/meta-data/spot/instance-action" and notice is not None:
                    self._answer(200, notice)
                else:
                    self._answer(404)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fake-imds",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def interrupt(self, instance_id: str = "", action: str = "terminate",
                  in_s: float = 120.0) -> str:
        """Post a spot interruption notice for one node (every node for ""); returns it."""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + in_s))
        notice = json.dumps({"action": action, "time": when})
        with self._lock:
            self.notices[instance_id] = notice
        return notice

    def revoke_tokens(self) -> None:
        """Forget every token handed out (as when IMDS restarts or a token expires)."""
        with self._lock:
            self.tokens.clear()
