"""How a node starts its worker processes: cold (a new interpreter each) or forked from a warm
template (an interpreter with torch imported when the image has it and CUDA never initialised:
a pool node keeps one ready, and a task's agent starts one, ``forkserver``, when the call's
code imports torch and the node starts several workers or may restart them).

A forked worker runs the same worker code as a cold one (``worker.run_and_exit``) with the
same environment, working directory and output pipe; what the template's interpreter read at
its own start (``PYTHON*``, ``LD_*``, and torch's start-up settings when torch is imported)
must match what the worker asks for, else the node starts it cold (``Template.problem`` says
why, and the agent logs it in the task's log). A forked worker starts with no exit handlers,
as a new interpreter does: the agent's (its log shippers) would wait on threads that exist
only in the agent.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

WORKER_MODULE = "flow_sdk.node.agent.worker"
# Read by the interpreter, the C library or torch when they start: a worker forked from a
# template that started with other values would not see the worker's own.
_STARTUP_PREFIXES = ("PYTHON", "LD_", "MALLOC_", "GLIBC_TUNABLES")
# With torch imported: the OpenMP and MKL runtimes read their settings when they load, and
# torch reads these few when it is imported (the rest of its variables when they are used).
_TORCH_STARTUP_PREFIXES = ("KMP_", "GOMP_", "OMP_", "MKL_", "TORCH_CPP_LOG_LEVEL",
                           "TORCH_SHOW_CPP_STACKTRACES", "TORCH_LOGS", "PYTORCH_JIT")
# Thread counts a forked worker applies itself (torch.set_num_threads), so they may differ.
_APPLIED_AFTER_FORK = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


class Process(Protocol):
    """What the agent needs of a worker process (``subprocess.Popen`` has it)."""

    pid: int
    stdout: IO[bytes] | None

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def cold(env: Mapping[str, str], cwd: Path) -> Process:
    """A worker in a new interpreter (``python -m flow_sdk.node.agent.worker``)."""
    return subprocess.Popen([sys.executable, "-m", WORKER_MODULE], cwd=cwd, env=dict(env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


class Forked:
    """A worker forked from this process: its pid, its output pipe and its exit status."""

    def __init__(self, pid: int, stdout: IO[bytes]) -> None:
        self.pid = pid
        self.stdout: IO[bytes] | None = stdout
        self._returncode: int | None = None

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def poll(self) -> int | None:
        if self._returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._returncode = os.waitstatus_to_exitcode(status)
        return self._returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(WORKER_MODULE, timeout or 0.0)
            time.sleep(0.005)
        assert self._returncode is not None
        return self._returncode


class WarmStart(Protocol):
    """What forks a node's workers from a warm interpreter: a ``Template`` (a pool node's
    daemon, this very process) or a task's ``forkserver.ForkServer``."""

    def problem(self, env: Mapping[str, str]) -> str | None:
        """Why a worker with ``env`` cannot be forked, or None."""

    def ready(self, keepalive: Callable[[], None]) -> str | None:
        """Wait until workers can be forked, calling ``keepalive`` every second meanwhile;
        why they cannot be, or None."""

    def describe(self) -> str: ...

    def fork(self, env: Mapping[str, str], cwd: Path) -> Process: ...


@dataclass(frozen=True)
class Template:
    """This process as a warm template: the environment it started with and the torch it
    imported (None: the image has none)."""

    env: Mapping[str, str]
    torch: str | None

    def ready(self, keepalive: Callable[[], None]) -> str | None:
        """A template is ready once made (``prepare_template``)."""
        return None

    def describe(self) -> str:
        return f"warm (torch {self.torch} imported)" if self.torch else \
            "warm (Python only: this image has no torch)"

    def problem(self, env: Mapping[str, str]) -> str | None:
        """Why a worker with ``env`` cannot be forked from this template, or None."""
        if self.torch and _cuda_initialised():
            return "CUDA was initialised in the template"
        return startup_problem(self.env, env, torch=bool(self.torch))

    def fork(self, env: Mapping[str, str], cwd: Path) -> Process:
        """A worker forked from this process, in a session of its own, as ``cold`` starts it."""
        read_end, write_end = os.pipe()
        gc.freeze()  # the child's collector leaves the agent's objects (and their pages) alone
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                become_worker(env, cwd, write_end)
            finally:
                os._exit(70)  # become_worker never returns
        os.close(write_end)
        return Forked(pid, os.fdopen(read_end, "rb"))


def startup_problem(started: Mapping[str, str], env: Mapping[str, str], *,
                    torch: bool) -> str | None:
    """Why a worker with ``env`` cannot be forked from an interpreter that started with
    ``started`` (and imported torch, ``torch``), or None."""
    if not sys.platform.startswith("linux"):
        return "workers are forked on Linux only"
    prefixes = _STARTUP_PREFIXES + (_TORCH_STARTUP_PREFIXES if torch else ())
    names = sorted(k for k in set(env) | set(started)
                   if k.startswith(prefixes) and k not in _APPLIED_AFTER_FORK
                   and env.get(k) != started.get(k))
    if names:
        return f"the task sets {', '.join(names)}, which the interpreter reads when it starts"
    return None


def prepare_template() -> Template:
    """Make this process a warm template: import torch when it is installed (never touching
    CUDA), and note the environment it started with."""
    try:
        import torch
    except ImportError:
        version = None
    else:
        version = str(torch.__version__)
    gc.freeze()  # what is imported now stays shared, page for page, with every fork
    return Template(dict(os.environ), version)


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def become_worker(env: Mapping[str, str], cwd: Path, output: int) -> None:
    """In the forked child: the worker's session, output, directory and environment (nothing
    else of the agent's: its other files are closed), then the worker itself."""
    os.setsid()
    atexit._clear()  # the agent's exit handlers (log shippers) are not the worker's
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 4096)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    sys.path[0] = str(cwd)  # as ``python -m`` started in ``cwd`` has it
    torch = sys.modules.get("torch")
    threads = env.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    from flow_sdk.node.agent import worker

    sys.argv = [str(worker.__file__)]
    worker.run_and_exit()
