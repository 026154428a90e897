"""OOM detection with the real kernel: a process over its memory cgroup's limit is killed by
the OOM killer and both the kernel log and the cgroup's counter say so; a process killed with
SIGKILL by someone else is not taken for one.

Needs root and a memory cgroup (CI runs as root on a VM): where either is missing the test
fails and says why, rather than skip.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flow_sdk.node.agent.oom import CGROUP_ROOT, CgroupOomCounter, KernelLog, killed_pids

LIMIT_BYTES = 64 * 1024 * 1024

# Joins the cgroup whose cgroup.procs is argv[1], says so, waits for a line on stdin, then
# writes 300 MB (multiplying bytes touches every page).
CHILD = """
import os, sys
with open(sys.argv[1], "w") as procs:
    procs.write(str(os.getpid()))
print("ready", flush=True)
sys.stdin.readline()
blocks = [b"x" * (1 << 20) for _ in range(300)]
print("survived", flush=True)
"""


def _v1_group(name: str) -> Path:
    group = CGROUP_ROOT / "memory" / name
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(LIMIT_BYTES))
    memsw = group / "memory.memsw.limit_in_bytes"
    if memsw.exists():  # no swap to escape to
        memsw.write_text(str(LIMIT_BYTES))
    return group


def _v2_group(name: str) -> Path:
    if "memory" not in (CGROUP_ROOT / "cgroup.subtree_control").read_text().split():
        (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory")
    group = CGROUP_ROOT / name
    group.mkdir()
    (group / "memory.max").write_text(str(LIMIT_BYTES))
    if (group / "memory.swap.max").exists():
        (group / "memory.swap.max").write_text("0")
    return group


def _remove(group: Path) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            group.rmdir()
            return
        except OSError:  # still busy for a moment after its last process is reaped
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A new memory cgroup limited to 64 MiB (cgroup v1 where it has the memory controller,
    else cgroup v2); removed at the end."""
    name = f"flow-test-{secrets.token_hex(4)}"
    v2_controllers = CGROUP_ROOT / "cgroup.controllers"
    try:
        if (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").is_file():
            group = _v1_group(name)
        elif v2_controllers.is_file() and "memory" in v2_controllers.read_text().split():
            group = _v2_group(name)
        else:
            pytest.fail(f"no memory cgroup controller under {CGROUP_ROOT} (v1 or v2)")
    except OSError as error:
        pytest.fail(f"cannot make a memory cgroup {name} (needs root): {error}")
    try:
        yield group
    finally:
        _remove(group)


def _start_child(group: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(group / "cgroup.procs")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    return child


def _stop(children: list[subprocess.Popen[str]]) -> None:
    for child in children:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)


def test_the_kernel_log_and_the_cgroup_counter_tell_an_oom_kill_from_a_sigkill(
        memory_cgroup: Path) -> None:
    log = KernelLog()
    assert log.available, f"the kernel log is needed (root, /dev/kmsg): {log.why_unavailable}"
    children: list[subprocess.Popen[str]] = []
    try:
        hungry = _start_child(memory_cgroup)
        children.append(hungry)
        counter = CgroupOomCounter(hungry.pid)
        assert counter.path is not None, "the worker's memory cgroup has no oom_kill counter"
        assert not counter.increased()
        assert hungry.stdin is not None
        hungry.stdin.write("go\n")
        hungry.stdin.flush()
        assert hungry.wait(timeout=60) == -signal.SIGKILL
        assert log.oom_killed(hungry.pid, wait_s=2)
        assert counter.increased()

        victim = _start_child(memory_cgroup)
        children.append(victim)
        victim_counter = CgroupOomCounter(victim.pid)
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait(timeout=10) == -signal.SIGKILL
        assert not log.oom_killed(victim.pid, wait_s=0.5)
        assert not victim_counter.increased()
    finally:
        _stop(children)
        log.close()


def test_both_forms_of_the_kernel_record_name_the_killed_pid() -> None:
    summary = (b"6,823,30117089557,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),"
               b"cpuset=/,mems_allowed=0,oom_memcg=/g,task_memcg=/g,task=python3,pid=7542,uid=0\n")
    killed = (b"3,824,30117089633,-;Memory cgroup out of memory: Killed process 7542 (python3) "
              b"total-vm:221372kB, anon-rss:72192kB, UID:0 pgtables:212kB oom_score_adj:0\n")
    assert killed_pids(summary) == {7542}
    assert killed_pids(killed) == {7542}
    assert killed_pids(b"6,825,30117089700,-;eth0: link up\n") == set()


def test_an_unreadable_log_is_unavailable_and_answers_false(tmp_path: Path) -> None:
    log = KernelLog(str(tmp_path / "no-such-device"))
    assert not log.available
    assert "no-such-device" in log.why_unavailable
    assert not log.oom_killed(os.getpid(), wait_s=0.1)
