"""Shared fixtures: every test gets its own FLOW_HOME, and no process it started outlives it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flow_testing import processes_with_env, wait_until  # noqa: F401  (re-exported)


def pytest_configure(config: pytest.Config) -> None:
    """A runner started in the background by a shell without job control inherits SIGINT
    ignored, and so would every process a test starts: the Ctrl-C tests would then test
    nothing. Give SIGINT its usual meaning for this run and its children."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Multi-process tests (marked ``slow``) first, in collection order otherwise. Runners
    steal queued work from each other (``--dist worksteal``), so the long tests start early
    and are spread out, instead of one of them running alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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
    named = {pid: _command_line(pid) for pid in leftover}
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"processes left running by this test: {named}"


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "(gone)"
