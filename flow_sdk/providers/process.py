"""Process bookkeeping for nodes that run as processes on this machine (Linux /proc first):
the local provider's nodes, the aws node runtime of the tests, and the node agent's
workers."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

# Processes found by their environment: defined beside the local nodes' keeper, which may
# import the standard library only.
from flow_sdk.providers._sshd import pids_with_env, stop_pids

__all__ = ["free_port", "is_alive", "kill_group", "pids_with_env", "start_ticks", "stop_pids"]


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
    if not _group_exists(pgid):
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        if not _group_exists(pgid):
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if reap is not None:
        time.sleep(0.05)
        reap()


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``address`` now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])
