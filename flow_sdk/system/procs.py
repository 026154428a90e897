"""Finding and stopping processes on this machine (Linux ``/proc`` first), and free ports.

The bottom layer beside ``errors``: the node agent's workers, the head job and every provider
whose nodes are processes here use it, and no provider owns it. Standard library only, and it
imports nothing of ``flow_sdk``: the local nodes' keeper loads this file by path, without
site-packages or the package.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import NoReturn

# The node agent lists its workers' process groups in this file of its working directory, so a
# provider whose nodes are processes here can stop everything a node started.
WORKER_PGIDS_FILE = "worker-pgids"

__all__ = ["WORKER_PGIDS_FILE", "become_subreaper", "command_line", "descendants",
           "die_with_parent", "ephemeral_ports", "exit_now", "free_port", "is_alive", "kill_group",
           "pids_with_env", "start_ticks", "stop_pids"]


_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def die_with_parent(parent: int | None = None) -> bool:
    """Ask Linux to SIGKILL this process when its parent dies (elsewhere: nothing). False
    when ``parent`` (the pid the caller expects as its parent) died already, before this
    could take effect: the caller should then exit."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    return parent is None or os.getppid() == parent


def become_subreaper() -> bool:
    """Make orphans of this process's descendants its children (Linux); False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0


def exit_now(code: int) -> NoReturn:
    """End this process with ``code``: run its atexit handlers, flush stdout and stderr, and
    leave without the interpreter's teardown. The teardown frees every module one by one,
    work thrown away at exit (about half a second of CPU once torch is imported), and C++
    libraries such as gloo can abort in their static destructors after the work is done
    ("terminate called without an active exception"). Threads still running end with the
    process, daemon or not, so call it once this process's own work is done and written: a
    file object that still holds unwritten data loses it."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _state(stat: str) -> str:
    """The state letter of a ``/proc/<pid>/stat`` line (after the command in parentheses)."""
    return stat.rsplit(")", 1)[1].split()[0]


def pids_with_env(key: str, values: Collection[str]) -> list[int]:
    """PIDs of live processes (not this one) whose environment sets ``key`` to one of
    ``values`` (Linux ``/proc``; empty elsewhere)."""
    needles = {f"{key}={value}".encode() for value in values}
    found: list[int] = []
    proc_root = Path("/proc")
    if not needles or not proc_root.is_dir():
        return found
    for entry in proc_root.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = _state((entry / "stat").read_text())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if state not in ("Z", "X") and not needles.isdisjoint(environ.split(b"\0")):
            found.append(int(entry.name))
    return found


def descendants(pid: int, prune: Collection[int] = ()) -> list[int]:
    """Every live process below ``pid`` in the process tree (its children, theirs, ...),
    sorted (Linux ``/proc``; empty elsewhere). A zombie counts until it is reaped. The
    processes in ``prune`` and everything below them are left out."""
    parents: dict[int, list[int]] = {}
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        return []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    todo = list(parents.get(pid, []))
    while todo:
        child = todo.pop()
        if child in prune:
            continue
        found.append(child)
        todo.extend(parents.get(child, []))
    return sorted(found)


def stop_pids(pids: Sequence[int], grace_s: float = 2.0) -> list[int]:
    """SIGTERM each process, SIGKILL those left after ``grace_s``; returns those signalled."""
    signalled = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        signalled.append(pid)
    deadline = time.monotonic() + grace_s
    alive = list(signalled)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in alive if _running(pid)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    return signalled


def process_state(pid: int) -> str | None:
    """The state letter of a live process (``R``, ``S``, ``T`` for stopped, ...), or None."""
    try:
        return _state(Path(f"/proc/{pid}/stat").read_text())
    except (FileNotFoundError, ProcessLookupError):
        return None


def _running(pid: int) -> bool:
    try:
        state = _state(Path(f"/proc/{pid}/stat").read_text())
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), or None when it is gone.

    Pairs with the pid to tell a live process from a later one that reused its pid.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (its ``SigCgt`` mask in
    ``/proc``); False for a process that is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def command_line(pid: int, limit: int = 200) -> str:
    """A process's command line for a log line: arguments joined by spaces, anything not
    printable shown as ``?`` (a process names itself, so it cannot forge a line), cut at
    ``limit`` characters; ``(gone)`` when it has exited."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return "(gone)"
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text[:limit] + ("..." if len(text) > limit else "")


def is_alive(pid: int, ticks: int | None) -> bool:
    if Path("/proc/self/stat").exists():
        return start_ticks(pid) is not None and (ticks is None or start_ticks(pid) == ticks)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int, grace_s: float = 3.0, reap: Callable[[], None] | None = None) -> None:
    """SIGTERM a process group, then SIGKILL whatever is left after ``grace_s``.

    ``reap`` collects exited children of this process, which otherwise linger as zombies
    that still count as members of the group.
    """
    kill_groups([pgid], grace_s, reap)


def kill_groups(pgids: Iterable[int], grace_s: float = 3.0,
                reap: Callable[[], None] | None = None) -> None:
    """SIGTERM every process group of ``pgids`` at once, then SIGKILL whatever is left of
    them after one shared ``grace_s``: n groups take one grace period, not n."""
    signalled = []
    for pgid in pgids:
        if not _group_exists(pgid):
            continue
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        signalled.append(pgid)
    deadline = time.monotonic() + grace_s
    while signalled and time.monotonic() < deadline:
        if reap is not None:
            reap()
        signalled = [pgid for pgid in signalled if _group_exists(pgid)]
        if signalled:
            time.sleep(0.05)
    for pgid in signalled:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    if signalled and reap is not None:
        time.sleep(0.05)
        reap()


_PORT_FLOOR = 10000  # below it are the ports services are configured with
_PORT_TRIES = 64
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_ports() -> range:
    """The ports the kernel hands out itself (to a bind to port 0 and to every outgoing
    connection): Linux's ``ip_local_port_range``, else its default."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def _bindable(address: str, port: int) -> bool:
    """Whether ``port`` can be bound now both on ``address`` and on every address."""
    for where in {address, "0.0.0.0"}:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((where, port))
            except OSError:
                return False
    return True


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on ``address`` now, for a server that binds it later (seconds or
    minutes on, in another process).

    It is drawn at random below the kernel's ephemeral range, so the kernel cannot hand it to
    a port-0 bind or an outgoing connection in the meantime (a port the kernel picked could be
    taken before the server binds it). Where that range leaves no room, the kernel picks.
    """
    ephemeral = ephemeral_ports()
    if ephemeral.start - _PORT_FLOOR >= _PORT_TRIES:
        draw = random.Random()
        for _ in range(_PORT_TRIES):
            port = draw.randrange(_PORT_FLOOR, ephemeral.start)
            if _bindable(address, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])
