"""What a pool node checks between two tasks: nothing of the last one survives.

The daemon is a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so every process a task
started, however it detached (``setsid``, a double fork), stays below it in the process
tree. After a task, every such process is killed and reaped, the task's working directory
(its ``TMPDIR`` too) is removed, and, where ``nvidia-smi`` exists, no process of the task
holds GPU memory. A node whose sweep fails leaves the pool: it powers off rather than run
the next task on a dirty node.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from flow_sdk import procs
from flow_sdk.wire import INSTANCE_ENV

_PR_SET_CHILD_SUBREAPER = 36
SWEEP_WAIT_S = 10.0


def become_subreaper() -> bool:
    """Make orphans of this process's descendants its children (Linux); False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0


@dataclass
class Sweep:
    """What one sweep stopped and what it found left."""

    stopped: list[int] = field(default_factory=list)
    left: list[int] = field(default_factory=list)  # processes that outlived SIGKILL
    files_left: bool = False
    gpu_held: list[int] = field(default_factory=list)  # processes still holding GPU memory
    gpu_checked: bool = False  # nvidia-smi was there to ask

    @property
    def clean(self) -> bool:
        return not self.left and not self.files_left and not self.gpu_held

    def describe(self) -> str:
        if self.clean:
            gpu = ", no GPU memory held" if self.gpu_checked else ""
            return (f"node clean: {len(self.stopped)} process(es) of the task stopped, its "
                    f"working directory removed{gpu}")
        return (f"node NOT clean: processes left {self.left}, files left {self.files_left}, "
                f"GPU memory held by {self.gpu_held}")


def task_processes(instance_id: str) -> list[int]:
    """This daemon's descendants: the last task's processes. Another node's processes this
    one started (a spare it launched on a machine shared with it) are not the task's."""
    mine = []
    for pid in procs.descendants(os.getpid()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        node = next((e.split(b"=", 1)[1].decode(errors="replace") for e in environ
                     if e.startswith(INSTANCE_ENV.encode() + b"=")), instance_id)
        if node == instance_id:
            mine.append(pid)
    return mine


def reap() -> None:
    """Collect every exited child (orphans come to a subreaper too)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep(instance_id: str, workdir: Path) -> Sweep:
    """Kill and reap the task's processes, remove its working directory, check the GPUs."""
    result = Sweep()
    deadline = time.monotonic() + SWEEP_WAIT_S
    while True:
        reap()
        live = task_processes(instance_id)
        if not live or time.monotonic() > deadline:
            result.left = live
            break
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            if pid not in result.stopped:
                result.stopped.append(pid)
        time.sleep(0.02)
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
