"""A fault-injecting AWS endpoint for the chaos soak: an HTTP proxy on 127.0.0.1 in front of
the simulated account's moto server.

Every AWS call of the scenario (the caller's, and the simulated nodes': they reach the same
endpoint through ``AWS_ENDPOINT_URL``) passes through it. A ``Rule`` answers the matching
calls with an AWS error document instead of forwarding them: EC2 capacity, throttling and
5xx errors, S3 ``SlowDown`` and 5xx errors. Nothing in the SDK knows the proxy exists.
"""

from __future__ import annotations

import http.client
import re
import sys
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te",
                "upgrade", "trailer"}
_SERVICE = re.compile(r"Credential=[^/]+/\d{8}/[^/]+/([a-z0-9-]+)/aws4_request")
UPSTREAM_TIMEOUT_S = 60.0

# (service, error code, HTTP status) the soak draws from
EC2_ERRORS = (("InsufficientInstanceCapacity", 500), ("RequestLimitExceeded", 503),
              ("InternalError", 500), ("Unavailable", 503))
S3_ERRORS = (("SlowDown", 503), ("InternalError", 500), ("ServiceUnavailable", 503))


@dataclass
class Rule:
    """Answer ``times`` calls of ``service`` (and ``action``, when set), after letting the
    first ``skip`` matching calls through, with ``code`` / ``status``."""

    service: str  # "ec2" | "s3"
    code: str
    status: int
    skip: int
    times: int
    action: str | None = None  # an EC2 action name (RunInstances, ...); None: any call
    seen: int = 0
    fired: int = 0

    def take(self, service: str, action: str) -> bool:
        if service != self.service or (self.action is not None and action != self.action):
            return False
        self.seen += 1
        if self.seen <= self.skip or self.fired >= self.times:
            return False
        self.fired += 1
        return True


@dataclass
class FaultBook:
    """The armed rules and what they did (shared by the proxy's threads)."""

    rules: list[Rule] = field(default_factory=list)
    armed: bool = False
    injected: list[str] = field(default_factory=list)  # "ec2 RunInstances -> Code (500)"
    calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def arm(self, rules: list[Rule]) -> None:
        with self.lock:
            self.rules, self.armed, self.injected, self.calls = rules, True, [], 0

    def disarm(self) -> None:
        with self.lock:
            self.armed = False

    def decide(self, service: str, action: str) -> Rule | None:
        with self.lock:
            self.calls += 1
            if not self.armed:
                return None
            for rule in self.rules:
                if rule.take(service, action):
                    self.injected.append(f"{service} {action} -> {rule.code} ({rule.status})")
                    return rule
            return None


def error_body(service: str, code: str) -> bytes:
    """The error document the service sends (EC2's query-protocol one, or S3's)."""
    if service == "s3":
        return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>injected by the chaos soak</Message><RequestId>chaos</RequestId>"
                f"</Error>").encode()
    return (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}'
            f"</Code><Message>injected by the chaos soak</Message></Error></Errors>"
            f"<RequestID>chaos</RequestID></Response>").encode()


def service_of(authorization: str) -> str:
    found = _SERVICE.search(authorization or "")
    return found.group(1) if found else "unknown"


def action_of(method: str, path: str, headers: dict[str, str], body: bytes) -> str:
    """The call's name: the query-protocol Action, the JSON target, or METHOD for S3."""
    target = headers.get("x-amz-target")
    if target:
        return target.rsplit(".", 1)[-1]
    query = urllib.parse.urlsplit(path).query
    fields = urllib.parse.parse_qs(query)
    if "Action" not in fields and headers.get("content-type", "").startswith(
            "application/x-www-form-urlencoded"):
        fields = urllib.parse.parse_qs(body.decode("latin-1"))
    return fields.get("Action", [method])[0]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
        return

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        body = self._body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        service = service_of(headers.get("authorization", ""))
        rule = self.server.book.decide(service, action_of(self.command, self.path, headers,
                                                          body))
        if rule is not None:
            self._reply(rule.status, [("Content-Type", "application/xml")],
                        error_body(service, rule.code), head=self.command == "HEAD")
            return
        self._forward(body)

    def _forward(self, body: bytes) -> None:
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port,
                                              timeout=UPSTREAM_TIMEOUT_S)
        try:
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in _HOP_HEADERS and k.lower() != "content-length"}
            headers["Content-Length"] = str(len(body))
            upstream.request(self.command, self.path, body=body, headers=headers)
            reply = upstream.getresponse()
            data = reply.read()
            kept = [(k, v) for k, v in reply.getheaders() if k.lower() not in _HOP_HEADERS]
            self._reply(reply.status, kept, data, head=self.command == "HEAD")
        finally:
            upstream.close()

    def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes,
               head: bool = False) -> None:
        self.send_response(status)
        has_length = False
        for key, value in headers:
            if key.lower() == "content-length":
                if not head or status >= 400:
                    value = str(len(data))
                has_length = True
            self.send_header(key, value)
        if not has_length:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that went away mid-request (a killed caller or node) is no error here;
        anything else is printed as the server would."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)  # type: ignore[arg-type]

    def __init__(self, upstream_port: int, book: FaultBook) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream_port = upstream_port
        self.book = book


class FaultProxy:
    """The proxy, serving in a thread of this process until ``stop()``."""

    def __init__(self, upstream_port: int) -> None:
        self.book = FaultBook()
        self._server = _ProxyServer(upstream_port, self.book)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
