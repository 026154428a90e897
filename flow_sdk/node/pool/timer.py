"""A pool node's idle stop: the node powers itself off after its idle time, with no client.

On a cloud node (``FLOW_NODE_POWEROFF=shutdown``, set by the node's bootstrap on the host) the
timer is the OS's own: ``shutdown -h +N`` re-armed at the end of each task and cancelled
while one runs, so the node stops even when its daemon hangs; powering off terminates the
instance. Elsewhere (a local node is a process, a container cannot power off its host) the
daemon keeps the deadline itself and exits at it, and its node stops with it.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Mapping

from flow_sdk.errors import FlowError
from flow_sdk.wire import envvars, runtimecap



class IdleTimer:
    """Arms and holds the node's power-off."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.os_timer = environ.get(envvars.NODE_POWEROFF) == "shutdown"
        self.deadline: float | None = None

    def describe(self) -> str:
        return "the OS's shutdown timer" if self.os_timer else "the daemon's own deadline"

    def arm(self, seconds: float) -> None:
        """Power off ``seconds`` from now unless re-armed or held first."""
        self.deadline = time.time() + seconds
        self._shutdown(seconds)

    def hold(self, cap_s: float | None) -> None:
        """A task runs: no idle stop; with a runtime cap, power off ``cap_s`` plus the
        power-off grace (``runtimecap.POWER_OFF``) from now (the task's agent stops it at its
        cap first)."""
        self.deadline = None
        self._shutdown(None if cap_s is None
                       else cap_s + runtimecap.POWER_OFF.grace_minutes() * 60)

    def expired(self, now: float | None = None) -> bool:
        return self.deadline is not None and (time.time() if now is None else now) >= \
            self.deadline

    def _shutdown(self, seconds: float | None) -> None:
        if not self.os_timer:
            return
        _run(["shutdown", "-c"])
        if seconds is not None:
            minutes = max(1, math.ceil(seconds / 60))
            _run(["shutdown", "-h", f"+{minutes}", "flow: pool idle stop"])


def _run(argv: list[str]) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FlowError(f"cannot arm the node's idle stop ({' '.join(argv)}): {exc}") from exc
    if done.returncode != 0 and argv[1:] != ["-c"]:  # "-c" with nothing armed may complain
        raise FlowError(f"cannot arm the node's idle stop ({' '.join(argv)}): "
                        f"{(done.stderr or done.stdout).strip()}")
