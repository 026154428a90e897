"""An instance metadata service (IMDSv2) for one simulated instance, on loopback.

A simulated node reaches it the way AWS SDKs and tools allow an endpoint override
(``AWS_EC2_METADATA_SERVICE_ENDPOINT``): nothing on this machine ever talks to 169.254.169.254.
It answers as EC2's does with ``HttpTokens=required``: ``PUT /latest/api/token`` (with a TTL
header of 1-21600 s) hands out a session token, and every ``GET /latest/meta-data/...``
without a valid token is refused with 401; unknown paths are 404. With ``credentials``, it
serves the instance profile's role and its temporary credentials under
``iam/security-credentials/``, as EC2 does.

Only the instance's own processes may ask: EC2's metadata service is reachable from its
instance alone, and this one listens on the loopback every local user reaches. The peer of
each connection is found through the kernel's socket table (``/proc/net/tcp``: the socket's
owner and inode); the request is answered only when that socket belongs to this process's
user and is held by one of ``peers()`` (the pids of the instance's processes), else it is
refused with 403.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Collection, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from flow_sdk.errors import ProviderError

TOKEN_PATH = "/latest/api/token"
META_PREFIX = "/latest/meta-data/"
CREDENTIALS_PATH = "iam/security-credentials/"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TTL_S = 21600
TCP_TABLE = Path("/proc/net/tcp")

# The role's name and its credentials document (AccessKeyId, SecretAccessKey, Token,
# Expiration ...), or None when the instance has no instance profile.
Credentials = Callable[[], tuple[str, dict[str, str]] | None]


def _hex_endpoint(address: str, port: int) -> str:
    """``address:port`` as ``/proc/net/tcp`` writes it (IPv4 in host byte order)."""
    packed = struct.unpack("=I", socket.inet_aton(address))[0]
    return f"{packed:08X}:{port:04X}"


def socket_of(client: tuple[str, int], server: tuple[str, int]) -> tuple[int, int] | None:
    """(owner uid, inode) of the client's end of the TCP connection ``client`` -> ``server``
    on this machine, or None when the kernel lists no such socket."""
    local, remote = _hex_endpoint(*client), _hex_endpoint(*server)
    for line in TCP_TABLE.read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 9 and fields[1] == local and fields[2] == remote:
            return int(fields[7]), int(fields[9])
    return None


def holds_socket(pids: Collection[int], inode: int) -> bool:
    """Whether one of ``pids`` holds the socket ``inode`` open."""
    wanted = f"socket:[{inode}]"
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # gone meanwhile
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == wanted:
                    return True
            except (FileNotFoundError, ProcessLookupError):
                continue  # closed meanwhile
    return False


class ImdsEmulator:
    """Serves ``metadata`` (path under ``/latest/meta-data/`` -> value) on 127.0.0.1 to the
    processes ``peers()`` names, and the role's credentials from ``credentials``."""

    def __init__(self, metadata: Mapping[str, str], peers: Callable[[], Collection[int]],
                 credentials: Credentials | None = None, host: str = "127.0.0.1") -> None:
        self.metadata = dict(metadata)
        self.peers = peers
        self.credentials = credentials
        self.refused = 0  # requests from processes that are not the instance's
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

    def allows(self, client: tuple[str, int]) -> bool:
        """Whether the connection from ``client`` is one of the instance's processes'."""
        host, port = self._server.server_address[:2]
        found = socket_of((client[0], client[1]), (str(host), int(port)))
        if found is None or found[0] != os.geteuid():
            return False
        return holds_socket(self.peers(), found[1])

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

    def lookup(self, path: str) -> str | None:
        """The value at ``path`` (under ``/latest/meta-data/``), or None (404)."""
        if self.credentials is not None and path.startswith(CREDENTIALS_PATH):
            role = self.credentials()
            if role is None:
                return None
            name, document = role
            if path == CREDENTIALS_PATH:
                return name
            return json.dumps(document) if path == CREDENTIALS_PATH + name else None
        return self.metadata.get(path)

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

            def _refused(self) -> bool:
                if imds.allows(self.client_address[:2]):
                    return False
                imds.refused += 1
                self._answer(403, "this metadata service answers its instance's processes "
                                  "only")
                return True

            def do_PUT(self) -> None:  # noqa: N802 (http.server's naming)
                if self._refused():
                    return
                if self.path != TOKEN_PATH:
                    self._answer(404)
                    return
                ttl = self.headers.get(TTL_HEADER, "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= MAX_TTL_S:
                    self._answer(400, f"{TTL_HEADER} must be 1-{MAX_TTL_S}")
                    return
                self._answer(200, imds._issue(int(ttl)))

            def do_GET(self) -> None:  # noqa: N802
                if self._refused():
                    return
                if not imds._valid(self.headers.get(TOKEN_HEADER)):
                    self._answer(401)
                    return
                if not self.path.startswith(META_PREFIX):
                    self._answer(404)
                    return
                try:
                    value = imds.lookup(self.path[len(META_PREFIX):])
                except ProviderError as exc:  # the role's credentials could not be made
                    self._answer(500, str(exc))
                    return
                if value is None:
                    self._answer(404)
                else:
                    self._answer(200, value)

        return Handler
