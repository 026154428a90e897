"""What a pool node checks between two tasks: nothing of the last one survives.

A task's processes are known by what they cannot change, never by what they say of themselves
(their environment, their name, their session):

- the daemon is a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so every process a task
  started, however it detached (``setsid``, a double fork), stays below it in the process
  tree. The task's processes are the daemon's descendants, less the subtrees of the processes
  the daemon started itself for another purpose (the helper that starts new spares, and those
  spares), which it tracks by pid and start time (``Own``);
- where the node has a writable cgroup v2, the task's agent also enters a cgroup of the task's
  own (``TaskCgroup``) before it starts anything, and everything in it is the task's too.

After a task each of its processes gets SIGTERM, then, after a short grace, SIGKILL (the whole
cgroup at once where there is one), re-scanned until none is left (a process may fork while it
is killed); every process signalled is logged with its pid and command line. The task's
working directory (its ``TMPDIR`` too) is removed and, where ``nvidia-smi`` exists, no process
of the task holds GPU memory. A node whose sweep fails leaves the pool: it powers off rather
than run the next task on a dirty node.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from flow_sdk.system import procs

SWEEP_WAIT_S = 10.0
TERM_GRACE_S = 1.0  # how long a leftover has to exit on SIGTERM before SIGKILL
CGROUP_PREFIX = "flow-task-"


class Own:
    """The processes the daemon started itself for another purpose than a task, by pid and
    start time (a later process that reuses a pid is not one of them): the sweep leaves them
    and everything below them alone."""

    def __init__(self) -> None:
        self._roots: dict[int, int] = {}

    def add(self, pid: int) -> None:
        """Track ``pid``, a live child of this process (so its pid cannot be reused yet)."""
        ticks = procs.start_ticks(pid)
        if ticks is not None:
            self._roots[pid] = ticks

    def live(self) -> set[int]:
        """The tracked processes still running (those gone are forgotten)."""
        for pid, ticks in list(self._roots.items()):
            if not procs.is_alive(pid, ticks):
                del self._roots[pid]
        return set(self._roots)


def _unescape(text: str) -> str:
    """A path of ``/proc/self/mountinfo``, where space, tab, newline and backslash are octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def own_cgroup_dir() -> Path | None:
    """This process's cgroup v2 directory, or None where there is no cgroup v2 mount that
    shows it (Linux ``/proc``)."""
    try:
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in memberships if line.startswith("0::/")), None)
    if path is None:
        return None
    for line in mounts:
        fields = line.split()
        if "-" not in fields or fields[fields.index("-") + 1] != "cgroup2":
            continue
        inside = os.path.relpath(path, _unescape(fields[3]))
        if inside != ".." and not inside.startswith("../"):
            return Path(os.path.normpath(Path(_unescape(fields[4])) / inside))
    return None


_CGROUP_NAME = re.compile(CGROUP_PREFIX + r"(\d+)-(\d+)-")


@dataclass(frozen=True)
class TaskCgroup:
    """A cgroup v2 of one task, beside the daemon's own. Its name carries the pid and start
    time of the daemon that made it (nodes of one task may share a machine and a parent
    cgroup), so one whose daemon died before sweeping it can be told and removed."""

    path: Path

    @classmethod
    def create(cls, task_id: str) -> TaskCgroup | None:
        """A new cgroup for ``task_id``, or None where the node has no writable cgroup v2 (a
        container's is often read-only): the process tree alone then tells the task's
        processes. Empty ones left by daemons that died go first."""
        parent = own_cgroup_dir()
        ticks = procs.start_ticks(os.getpid())
        if parent is None or ticks is None:
            return None
        _remove_orphans(parent)
        path = parent / (f"{CGROUP_PREFIX}{os.getpid()}-{ticks}-"
                         + re.sub(r"[^A-Za-z0-9._-]", "_", task_id))
        try:
            path.mkdir()
        except OSError:
            return None
        return cls(path)

    def enter(self) -> str:
        """Move this process into the cgroup (its children to come are born there); what
        went wrong, or an empty string."""
        try:
            (self.path / "cgroup.procs").write_text(f"{os.getpid()}\n")
        except OSError as exc:
            return (f"cannot enter {self.path}: {exc}; the daemon's process tree alone tells "
                    "the task's processes")
        return ""

    def members(self) -> list[int]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return [int(pid) for pid in text.split()]

    def kill(self) -> None:
        """SIGKILL every member at once, those forked meanwhile too (``cgroup.kill``, Linux
        5.14 and later). Without it the sweep's SIGKILL of each member by pid does it."""
        kill_file = self.path / "cgroup.kill"
        if kill_file.exists():
            kill_file.write_text("1")

    def remove(self, wait_s: float = 1.0) -> str:
        """Remove the cgroup once its last member has gone (the kernel may take a moment to
        see it empty); what went wrong, or an empty string."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.path.rmdir()
            except FileNotFoundError:
                return ""
            except OSError as exc:
                if time.monotonic() > deadline:
                    return f"cannot remove cgroup {self.path}: {exc}"
                time.sleep(0.02)
                continue
            return ""



def _remove_orphans(parent: Path) -> None:
    """Remove the empty task cgroups in ``parent`` whose daemon is gone (a daemon killed
    mid-task never swept its own); one still holding processes stays."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        made_by = _CGROUP_NAME.match(entry.name)
        if made_by is None or procs.is_alive(int(made_by[1]), int(made_by[2])):
            continue
        try:
            entry.rmdir()
        except OSError:
            continue  # not empty (a process of its task still runs) or removed meanwhile


def tracking(cgroup: TaskCgroup | None) -> str:
    """How the sweep will know the task's processes, for the daemon's log."""
    if cgroup is None:
        return "the daemon's process tree (no writable cgroup v2 here)"
    return f"cgroup {cgroup.path} and the daemon's process tree"


@dataclass
class Sweep:
    """What one sweep stopped and what it found left."""

    stopped: list[int] = field(default_factory=list)
    left: list[int] = field(default_factory=list)  # processes that outlived SIGKILL
    files_left: bool = False
    gpu_held: list[int] = field(default_factory=list)  # processes still holding GPU memory
    gpu_checked: bool = False  # nvidia-smi was there to ask
    cgroup_left: str = ""  # why the task's (empty) cgroup could not be removed

    @property
    def clean(self) -> bool:
        return not self.left and not self.files_left and not self.gpu_held

    def describe(self) -> str:
        if self.clean:
            gpu = ", no GPU memory held" if self.gpu_checked else ""
            note = f" ({self.cgroup_left})" if self.cgroup_left else ""
            pids = f" {self.stopped}" if self.stopped else ""
            return (f"node clean: killed {len(self.stopped)} leftover process(es) of the "
                    f"task{pids}, its working directory removed{gpu}{note}")
        return (f"node NOT clean: processes left {self.left}, files left {self.files_left}, "
                f"GPU memory held by {self.gpu_held}")


def task_processes(own: Own, cgroup: TaskCgroup | None) -> list[int]:
    """The last task's live processes: the daemon's descendants outside the subtrees it
    started itself, and every member of the task's cgroup."""
    found = set(procs.descendants(os.getpid(), prune=own.live()))
    if cgroup is not None:
        found.update(cgroup.members())
    return sorted(pid for pid in found if procs.start_ticks(pid) is not None)  # no zombies


def reap() -> None:
    """Collect every exited child (orphans come to a subreaper too)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep(workdir: Path, own: Own, cgroup: TaskCgroup | None,
          log: Callable[[str], None]) -> Sweep:
    """Kill and reap the task's processes, remove its working directory and cgroup, check the
    GPUs; ``log`` gets a line for each process signalled."""
    result = Sweep()
    start = time.monotonic()
    deadline = start + SWEEP_WAIT_S
    sent: dict[int, signal.Signals] = {}
    while True:
        reap()
        live = task_processes(own, cgroup)
        now = time.monotonic()
        if not live or now > deadline:
            result.left = live
            break
        sig = signal.SIGTERM if now - start < TERM_GRACE_S else signal.SIGKILL
        if sig == signal.SIGKILL and cgroup is not None:
            cgroup.kill()
        for pid in live:
            command = procs.command_line(pid)
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue
            if sent.get(pid) != sig:
                sent[pid] = sig
                log(f"killing leftover process {pid} ({command}): {sig.name}")
            if pid not in result.stopped:
                result.stopped.append(pid)
        time.sleep(0.02)
    if cgroup is not None and not result.left:
        result.cgroup_left = cgroup.remove()
    shutil.rmtree(workdir, ignore_errors=True)
    result.files_left = workdir.exists()
    result.gpu_checked = shutil.which("nvidia-smi") is not None
    result.gpu_held = _gpu_holders(set(result.stopped), deadline)
    return result


def _gpu_holders(ours: set[int], deadline: float) -> list[int]:
    """Processes of the task that nvidia-smi still lists as holding GPU memory (waiting up to
    ``deadline`` for the driver to release it); empty where there is no nvidia-smi."""
    if not ours or shutil.which("nvidia-smi") is None:
        return []
    while True:
        try:
            listed = subprocess.run(["nvidia-smi", "--query-compute-apps=pid",
                                     "--format=csv,noheader"], capture_output=True, text=True,
                                    timeout=30).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            return []
        held = sorted(ours & {int(p) for p in listed if p.strip().isdigit()})
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.2)
