"""Helpers of the dashboard tests: ``flow ui`` as a real subprocess, the sockets it listens
on (read from /proc), and the system's Chromium under Playwright."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

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


def start_ui(home: Path, *args: str, timeout: float = 30.0) -> Ui:
    """``flow ui ARGS`` with ``FLOW_HOME=home``, once it printed its URL."""
    proc = subprocess.Popen([FLOW, "ui", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FLOW_HOME": str(home)})
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
