"""The simulated account's moto server: one per flow data directory, shared by every command.

The account is the server's memory, so it must outlive one command for ``flow gc``, ``flow
volumes`` and ``flow list`` to see what a rehearsal left. ``<home>/server.json`` records the
running one (pid, its start time in clock ticks, port, when it started, its idle time);
``ensure_server`` reuses it while it is alive and answers, and starts one when there is none.
``server.lock`` (an ``flock``) orders starters against each other and against the server's own
idle exit, so no command is handed a server that is going away. ``stop_server`` stops it by
its recorded pid.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from flow_sdk.errors import ProviderError, install_hint
from flow_sdk.system import procs

STATE_FILE = "server.json"
CLOUD_DIR = "cloud"  # the simulate root: instance records, node directories, EFS, EBS
LOCK_FILE = "server.lock"
LOG_FILE = "server.log"
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
INSTALL_HINT = install_hint("the simulated cloud", "moto[server]", "awscli")


@dataclass(frozen=True)
class ServerState:
    pid: int
    ticks: int | None  # the process's start time (clock ticks): tells it from a reused pid
    port: int
    started: float  # epoch seconds
    idle_stop_s: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return procs.is_alive(self.pid, self.ticks)


def read_state(home: Path) -> ServerState | None:
    """The recorded server, or None when none is recorded (or the record is unreadable)."""
    try:
        data = json.loads((home / STATE_FILE).read_text())
        return ServerState(pid=int(data["pid"]), ticks=data.get("ticks"),
                           port=int(data["port"]), started=float(data["started"]),
                           idle_stop_s=float(data["idle_stop_s"]))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None  # a torn or foreign file: treated as no server; the next start rewrites it


def write_state(home: Path, state: ServerState) -> None:
    tmp = home / f"{STATE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(asdict(state)))
    tmp.replace(home / STATE_FILE)


def clear_state(home: Path, pid: int) -> None:
    """Remove the record when it names ``pid`` (a newer server's record stays)."""
    state = read_state(home)
    if state is not None and state.pid == pid:
        (home / STATE_FILE).unlink(missing_ok=True)


@contextmanager
def locked(home: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold ``server.lock``; yields False (holding nothing) when ``wait`` is False and another
    process holds it."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(home / LOCK_FILE, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def answers(url: str) -> bool:
    """Whether a moto server answers at ``url`` (a request, so it also resets its idle time)."""
    try:
        with urllib.request.urlopen(f"{url}/", timeout=10) as reply:  # a few hundred bytes
            return bool(reply.status == 200)
    except urllib.error.HTTPError:
        return True  # it answered
    except (urllib.error.URLError, OSError):
        return False


def running_server(home: Path) -> ServerState | None:
    """The running server of ``home``, else None: nothing is started."""
    with locked(home):
        state = read_state(home)
        return state if state is not None and state.alive() and answers(state.url) else None


def ensure_server(home: Path, idle_stop_s: float) -> ServerState:
    """The running server of ``home``, else a new one (which stops itself after
    ``idle_stop_s`` seconds with no request and no live simulated instance)."""
    with locked(home):
        state = read_state(home)
        if state is not None and state.alive() and answers(state.url):
            return state
        if state is not None and state.alive():
            _stop_pid(state)  # alive but deaf: replaced
        return _start(home, idle_stop_s)


def _start(home: Path, idle_stop_s: float) -> ServerState:
    if importlib.util.find_spec("moto") is None:
        raise ProviderError("the aws-sim provider runs a moto server, and moto is not installed "
                            f"for {sys.executable}; {INSTALL_HINT}")
    (home / STATE_FILE).unlink(missing_ok=True)
    with open(home / LOG_FILE, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flow_sdk.sim._serve", str(home), repr(float(idle_stop_s))],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        state = read_state(home)
        if state is not None and state.pid == proc.pid:
            return state
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    tail = (home / LOG_FILE).read_text(errors="replace").splitlines()[-15:]
    raise ProviderError("the simulated aws account's moto server did not start (is "
                        f"'moto[server]' installed? {INSTALL_HINT}); its log "
                        f"{home / LOG_FILE} ends:\n" + "\n".join(tail))


def _stop_pid(state: ServerState) -> None:
    os.kill(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while state.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if state.alive():
        procs.stop_pids([state.pid], grace_s=0)


def stop_server(home: Path) -> int | None:
    """Stop the recorded server by its pid; returns that pid, or None when none was running."""
    with locked(home):
        state = read_state(home)
        if state is None or not state.alive():
            (home / STATE_FILE).unlink(missing_ok=True)
            return None
        _stop_pid(state)
        clear_state(home, state.pid)
        return state.pid
