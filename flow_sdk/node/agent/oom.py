"""Telling a worker the kernel's OOM killer ended from one that was killed some other way.

Both end with SIGKILL, so the exit status cannot tell them apart. Two sources can:

* :class:`KernelLog` reads the kernel's log (``/dev/kmsg``) from the moment the agent opens it
  and remembers every process the OOM killer killed. It needs root (or CAP_SYSLOG) and names
  processes by their pid in the machine's first pid namespace, so an agent in a container with
  its own pid namespace should rely on the counter below.
* :class:`CgroupOomCounter` notes the ``oom_kill`` counter of a live worker's memory cgroup and
  later says whether it grew. The counter belongs to the cgroup, so when workers share one it
  says that some process of that cgroup was killed, which, for a worker that died of SIGKILL
  meanwhile, is as good a sign as the agent gets.

Standard library only.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

KMSG_PATH = "/dev/kmsg"
CGROUP_ROOT = Path("/sys/fs/cgroup")
_RECORD_BYTES = 8192  # more than the kernel's longest record
_POLL_S = 0.05

# "Memory cgroup out of memory: Killed process 7542 (python3) ..." (or "Out of memory: ...")
_KILLED = re.compile(rb"Killed process (\d+) ")
# "oom-kill:constraint=CONSTRAINT_MEMCG,...,task=python3,pid=7542,uid=0"
_OOM_KILL = re.compile(rb"oom-kill:.*[,:]pid=(\d+)")

__all__ = ["CGROUP_ROOT", "CgroupOomCounter", "KMSG_PATH", "KernelLog", "cgroup_oom_kills",
           "killed_pids"]


def killed_pids(record: bytes) -> set[int]:
    """The pids a kernel log record says the OOM killer killed (usually none)."""
    found = {int(match) for match in _KILLED.findall(record)}
    found.update(int(match) for match in _OOM_KILL.findall(record))
    return found


class KernelLog:
    """The kernel log from the moment this object was made, read for OOM kills.

    Open it when the agent starts and ask :meth:`oom_killed` when a worker dies of SIGKILL.
    Where the log cannot be read, ``available`` is False, ``why_unavailable`` says why and
    :meth:`oom_killed` answers False.
    """

    def __init__(self, path: str = KMSG_PATH) -> None:
        self.path = path
        self.why_unavailable = ""
        self._killed: set[int] = set()
        self._fd: int | None = None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as error:
            self.why_unavailable = f"cannot open {path}: {error.strerror or error}"
            return
        try:
            os.lseek(fd, 0, os.SEEK_END)
        except OSError as error:
            os.close(fd)
            self.why_unavailable = f"cannot seek to the end of {path}: {error.strerror or error}"
            return
        self._fd = fd

    @property
    def available(self) -> bool:
        return self._fd is not None

    def oom_killed(self, pid: int, wait_s: float = 0.0) -> bool:
        """Whether the OOM killer killed ``pid`` since this log was opened.

        ``wait_s``: how long to keep reading for the record when it is not there yet (the
        agent may ask right after the worker's exit); 0 reads what is there and answers.
        """
        deadline = time.monotonic() + wait_s
        while True:
            self._drain()
            if pid in self._killed or not self.available:
                return pid in self._killed
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self.why_unavailable = "closed"

    def _drain(self) -> None:
        """Read every record written since the last read and remember the pids killed."""
        while self._fd is not None:
            try:
                record = os.read(self._fd, _RECORD_BYTES)
            except BlockingIOError:  # no more records for now
                return
            except BrokenPipeError:  # records were overwritten before we read them
                continue
            except OSError as error:
                self.close()
                self.why_unavailable = f"reading {self.path} failed: {error.strerror or error}"
                return
            if not record:
                return
            self._killed.update(killed_pids(record))


def _counter_files(cgroup_lines: list[str]) -> list[Path]:
    """Where the ``oom_kill`` counter of the memory cgroup named by these lines of
    ``/proc/<pid>/cgroup`` may be: cgroup v1's memory hierarchy first, then cgroup v2."""
    found: list[Path] = []
    for line in cgroup_lines:
        hierarchy, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if "memory" in controllers.split(","):
            found.insert(0, CGROUP_ROOT / "memory" / relative / "memory.oom_control")
        elif hierarchy == "0" and not controllers:
            found.append(CGROUP_ROOT / relative / "memory.events")
            found.append(CGROUP_ROOT / "unified" / relative / "memory.events")
    return found


def _oom_kill_count(counters: Path) -> int | None:
    """The ``oom_kill`` field of a cgroup's ``memory.oom_control`` or ``memory.events``."""
    try:
        text = counters.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def _counter_path(pid: int) -> Path | None:
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for path in _counter_files([line for line in lines if line.count(":") >= 2]):
        if _oom_kill_count(path) is not None:
            return path
    return None


def cgroup_oom_kills(pid: int) -> int | None:
    """How many processes the OOM killer has killed in the memory cgroup of the live process
    ``pid``; None when the process is gone or its cgroup has no such counter."""
    path = _counter_path(pid)
    return None if path is None else _oom_kill_count(path)


class CgroupOomCounter:
    """The OOM-kill counter of a live worker's memory cgroup, noted now to compare later.

    ``path`` is the counter's file, or None where there is none (then :meth:`increased`
    answers False).
    """

    def __init__(self, pid: int) -> None:
        self.path = _counter_path(pid)
        self.start = None if self.path is None else _oom_kill_count(self.path)

    def increased(self) -> bool:
        """Whether the OOM killer has killed a process of that cgroup since this was made."""
        if self.path is None or self.start is None:
            return False
        now = _oom_kill_count(self.path)
        return now is not None and now > self.start
