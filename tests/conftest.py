"""Shared fixtures: every test gets its own FLOW_HOME, and no process it started outlives it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def processes_with_env(key: str, value: str) -> list[int]:
    """PIDs of processes (other than this one) whose environment has ``key=value``."""
    needle = f"{key}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def wait_until(predicate: object, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture(autouse=True)
def flow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "flow-home"
    monkeypatch.setenv("FLOW_HOME", str(home))
    yield home
    # Anything still running with this FLOW_HOME was started by this test: stop it by PID,
    # then fail the test, so a leak is never silent.
    leftover = processes_with_env("FLOW_HOME", str(home))
    deadline = time.monotonic() + 5
    while leftover and time.monotonic() < deadline:
        time.sleep(0.1)
        leftover = processes_with_env("FLOW_HOME", str(home))
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"processes left running by this test: {leftover}"
