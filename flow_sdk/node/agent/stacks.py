"""Taking this node's workers' stacks, and answering the task's stacks requests with them.

Each worker registered a ``faulthandler`` dump of every thread on ``STACKS_SIGNAL`` into its
stacks file at start-up; the agent empties the file, sends the signal and reads what the worker
wrote. A worker that cannot answer (stopped by SIGSTOP, gone) is named with why. Where py-spy
is installed, its native frames are added. The frames are kept as data too, each in the
caller's file (the worker noted where its call's code came from beside its stacks file) with
this node's source line, for ``flow_sdk.wire.tracebacks`` to render as it renders a traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable

from flow_sdk.system import procs
from flow_sdk.wire import tracebacks
from flow_sdk.errors import FlowError
from flow_sdk.node.agent.worker import ORIGINS_SUFFIX, STACKS_SIGNAL
from flow_sdk.node.agent.workers import WorkerGroup
from flow_sdk.wire.signing import SignedStore
from flow_sdk.wire.stacks import (
    StackDump,
    StacksRequest,
    request_numbers,
    stack_dump_key,
    stacks_prefix,
    stacks_request_key,
    threads,
)

DUMP_WAIT_S = 3.0  # how long a worker may take to write its dump
CHECK_S = 1.0  # how often an agent looks for a new stacks request
PY_SPY_TIMEOUT_S = 10.0


def _wait_written(path: str, deadline: float) -> str:
    """The file's text once it stopped growing (or at the deadline)."""
    size, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now_size = os.path.getsize(path) if os.path.exists(path) else 0
        if now_size != size:
            size, stable_since = now_size, time.monotonic()
        elif size > 0 and time.monotonic() - stable_since > 0.1:
            break
        time.sleep(0.02)
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def _py_spy(pid: int) -> str:
    tool = shutil.which("py-spy")
    if tool is None:
        return ""
    try:
        done = subprocess.run([tool, "dump", "--native", "--pid", str(pid)],
                              capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"\n(py-spy failed: {exc})"
    return "\n-- py-spy (native frames) --\n" + (done.stdout or done.stderr)


def _origins(stacks_path: str) -> tuple[tracebacks.Origins, str]:
    """The worker's code origins (empty before it noted them), and what went wrong reading
    them ("" when nothing did)."""
    try:
        with open(stacks_path + ORIGINS_SUFFIX, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return {}, ""
    except OSError as exc:
        return {}, f" (its code origins are unreadable: {exc})"
    found = tracebacks.origins_from_json(text)
    return (found, "") if found is not None else ({}, " (its code origins are malformed)")


def _frames_of(text: str, stacks_path: str) -> tuple[list[list[tracebacks.Frame]], str]:
    """faulthandler's ``text`` as threads of frames (see ``StackDump.threads``), and a note
    on the origins when they could not be read."""
    origins, note = _origins(stacks_path)
    return [tracebacks.frames([(file, line, function, None) for file, line, function in
                               reversed(thread)], origins) for thread in threads(text)], note


def take(workers: WorkerGroup, node: int) -> list[StackDump]:
    """Every live worker's stacks, taken together (signalled at once, then read)."""
    live = [w for w in workers.workers if w.proc.poll() is None]
    asked = []
    for w in live:
        path = workers.stacks_path(w.rank)
        if procs.process_state(w.proc.pid) == "T":
            asked.append((w, None, "no stack: the worker is stopped (SIGSTOP or a debugger)"))
            continue
        open(path, "w").close()  # the worker appends: start from empty
        try:
            os.kill(w.proc.pid, STACKS_SIGNAL)
        except ProcessLookupError:
            asked.append((w, None, "no stack: the worker exited"))
            continue
        asked.append((w, str(path), "faulthandler"))
    deadline = time.monotonic() + DUMP_WAIT_S
    dumps = []
    for w, path, how in asked:
        text = _wait_written(path, deadline) if path else ""
        if path and not text:
            how = f"no stack: the worker did not answer within {DUMP_WAIT_S:g}s"
        found: list[list[tracebacks.Frame]] = []
        native = ""
        if text and path:
            found, note = _frames_of(text, path)
            native = _py_spy(w.proc.pid)
            how += ("+py-spy" if native else "") + note
        dumps.append(StackDump(w.rank, node, text, time.time(), how, found, native))
    return dumps


class StacksAnswer:
    """Answers the task's stacks requests from this node's workers, in number order."""

    def __init__(self, store: SignedStore, task_id: str, log: Callable[[str], None]) -> None:
        self.store, self.task_id, self.log = store, task_id, log
        existing = request_numbers(store.list(stacks_prefix(task_id)))
        self.next = (existing[-1] + 1) if existing else 1  # older requests are not this run's

    def check(self, workers: WorkerGroup, node: int) -> None:
        """Answer the next request, when there is one."""
        try:
            raw = self.store.get_record(stacks_request_key(self.task_id, self.next))
            if raw is None:
                return
            request = StacksRequest.from_json(raw)
            self.next += 1
            if request.node is not None and request.node != node:
                return
            dumps = take(workers, node)
            for dump in dumps:
                self.store.put_record(stack_dump_key(self.task_id, request.number, dump.rank),
                                      dump)
            self.log(f"stacks request {request.number} ({request.reason}): sent "
                     f"{len(dumps)} worker stack(s)")
        except (FlowError, OSError) as exc:
            self.log(f"could not answer stacks request {self.next}: {exc}")
            self.next += 1

