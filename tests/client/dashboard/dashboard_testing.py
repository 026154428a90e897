"""Helpers of the dashboard tests: ``flow ui`` as a real subprocess, HTTP to it by the host
name its URL gives, the sockets it listens on (read from /proc), a second loopback server
that records what reaches it, and the system's Chromium under Playwright."""

from __future__ import annotations

import http.client
import http.server
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCREENSHOTS = ROOT / "screenshots"  # git-ignored; the README names it
CHROMIUM = "/usr/bin/chromium"
_BESIDE = Path(sys.executable).with_name("flow")
FLOW = str(_BESIDE) if _BESIDE.exists() else (shutil.which("flow") or "flow")


@dataclass
class Ui:
    """A running ``flow ui``: its process and the URL it printed (with the token)."""

    proc: subprocess.Popen[str]
    url: str

    @property
    def base(self) -> str:
        return self.url.split("/?", 1)[0]

    @property
    def token(self) -> str:
        return self.url.rsplit("token=", 1)[1]

    @property
    def host(self) -> str:
        """``NAME:PORT``, as the URL gives it (the ``Host`` header the server wants)."""
        return urlsplit(self.url).netloc

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None, self.url
        return port

    def stop(self) -> int:
        """SIGINT, as Ctrl-C sends it; its exit code. Killed (and the test failed by the
        caller's check) only if it did not exit within 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def start_ui(home: Path, *args: str, timeout: float = 30.0,
             env: dict[str, str] | None = None) -> Ui:
    """``flow ui ARGS`` with ``FLOW_HOME=home`` (and ``env``), once it printed its URL."""
    proc = subprocess.Popen([FLOW, "ui", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {}), "FLOW_HOME": str(home)})
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if "serving on " in line:
                return Ui(proc, line.split("serving on ", 1)[1].strip())
            if not line and proc.poll() is not None:
                break
    proc.kill()
    _, err = proc.communicate(timeout=10)
    raise AssertionError(f"flow ui printed no URL within {timeout}s: {err}")


@dataclass
class Answer:
    status: int
    body: str
    headers: http.client.HTTPMessage

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


def request(ui: Ui, path: str, headers: dict[str, str] | None = None, method: str = "GET",
            body: str | None = None, host: str | None = None) -> Answer:
    """One request to the server on 127.0.0.1 (this machine's resolver may not know
    ``*.localhost``), naming ``host`` in its ``Host`` header (the URL's by default)."""
    conn = http.client.HTTPConnection("127.0.0.1", ui.port, timeout=10)
    try:
        conn.request(method, path, body=body,
                     headers={"Host": host or ui.host, **(headers or {})})
        response = conn.getresponse()
        return Answer(response.status, response.read().decode(), response.headers)
    finally:
        conn.close()


@dataclass
class Seen:
    """One request a ``Recorder`` received: its path and headers (names lowercased)."""

    path: str
    headers: dict[str, str] = field(default_factory=dict)


class Recorder:
    """A second HTTP server on 127.0.0.1 (another port), in a thread of this process: it
    answers every GET with a short page and records what reached it. ``close`` stops it."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
                seen.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}))
                body = (b"<!doctype html><link rel=icon href='data:,'><title>other server</title>"
                        b"<p id=other>other</p>")
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return  # what reached it is in ``seen``, not on stderr

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive()


def command_lines_holding(text: str) -> dict[int, str]:
    """Every process whose command line holds ``text``: ``{pid: command line}``."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue  # the process ended meanwhile
        if text in line:
            found[int(cmdline.parent.name)] = line
    return found


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[len("socket:["):-1])
    return found


def listening_addresses(pid: int) -> list[str]:
    """``ADDRESS:PORT`` of every TCP socket ``pid`` listens on (IPv4 and IPv6)."""
    inodes = _socket_inodes(pid)
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            raw, port = local.split(":")
            assert len(raw) == width
            if width == 8:
                address = ".".join(str(b) for b in reversed(bytes.fromhex(raw)))
            else:
                words = [bytes.fromhex(raw[i:i + 8])[::-1].hex() for i in range(0, 32, 8)]
                address = "".join(words)
            found.append(f"{address}:{int(port, 16)}")
    return found


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def launch_chromium(playwright: object) -> object:
    """Debian's Chromium, headless, under Playwright; fails loudly when it is missing
    (`bash scripts/setup.sh --dev` installs it)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"the dashboard's browser tests need Chromium at {CHROMIUM}: "
                    "bash scripts/setup.sh --dev installs it (apt-get install chromium)")
    return playwright.chromium.launch(  # type: ignore[attr-defined]
        executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
