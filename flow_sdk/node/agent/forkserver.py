"""A node's fork server: a new interpreter that imports torch once (CUDA untouched) and forks
the task's workers from it, so that a node of several workers, or one that restarts them,
imports torch once instead of once per worker start (``Agent._warm_up`` decides when).

It never holds the task's secret: the agent starts it as a new interpreter, with its own
environment once the secret's traces left it (``wire.take_node_boot``), and sends it nothing
but each worker's environment, working directory and output pipe. So no worker inherits the
secret, as with cold workers (a pool node's agent, which forks its workers itself, is the
exception its trust model states).

The server forks twice for each worker and the intermediate process exits at once: the agent is
its children's subreaper (``PR_SET_CHILD_SUBREAPER``), so every worker becomes the agent's own
child, which it waits for and signals as it does a cold one. The server ends when the agent
closes its end of the socket, or with the agent (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from flow_sdk.system import procs
from flow_sdk.node.agent.spawn import (
    Forked,
    Process,
    Template,
    become_worker,
    cold,
    prepare_template,
    startup_problem,
)

MODULE = "flow_sdk.node.agent.forkserver"
READY_TIMEOUT_S = 300.0  # torch's import on a slow disk; workers wait for it as cold ones would
ANSWER_TIMEOUT_S = 30.0  # a fork
MAX_MESSAGE_BYTES = 1 << 20


class ForkServer:
    """The agent's side: it starts the server and asks it for workers. It offers what a warm
    ``Template`` does (``spawn.WarmStart``), once the server is ready."""

    def __init__(self, env: Mapping[str, str]) -> None:
        """A server to start with ``env`` (this agent's environment) when the first workers
        are about to start (``ready``): by then the agent has set up what they inherit from
        it (a task's volumes may put it in a mount namespace of its own)."""
        self._env = dict(env)
        self._socket, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._process: subprocess.Popen[bytes] | None = None
        self._template: Template | None = None
        self._failure: str | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        """Start the server, this process made its descendants' subreaper first."""
        if not procs.become_subreaper():
            raise OSError("this process cannot be its descendants' subreaper")
        with self._theirs:
            return subprocess.Popen(
                [sys.executable, "-m", MODULE, str(self._theirs.fileno()), str(os.getpid())],
                env=self._env, pass_fds=(self._theirs.fileno(),), stdin=subprocess.DEVNULL)

    def problem(self, env: Mapping[str, str]) -> str | None:
        """Why a worker with ``env`` cannot be forked by the server (started or not), or
        None."""
        return self._failure or startup_problem(self._env, env, torch=True)

    def ready(self, keepalive: Callable[[], None]) -> str | None:
        """Start the server and wait until it says it is ready (it imports torch meanwhile),
        calling ``keepalive`` every second; why it cannot fork workers, or None."""
        if self._template is not None or self._failure is not None:
            return self._failure
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            self._process = self._process or self._start()
            self._socket.settimeout(1.0)
            while True:
                try:
                    hello = json.loads(self._socket.recv(MAX_MESSAGE_BYTES) or b"null")
                    break
                except TimeoutError:
                    if time.monotonic() > deadline or self._process.poll() is not None:
                        raise
                    keepalive()
            torch = hello["torch"]
        except (OSError, ValueError, TypeError, KeyError) as exc:
            status = self._process.poll() if self._process is not None else None
            self._failure = (f"the fork server did not start (exit status {status}, "
                             f"{type(exc).__name__}: {exc})")
        else:
            self._template = Template(self._env, str(torch) if torch else None)
        return self._failure

    def describe(self) -> str:
        return self._template.describe() if self._template is not None else \
            f"cold: {self._failure or 'the fork server is not ready'}"

    def fork(self, env: Mapping[str, str], cwd: Path) -> Process:
        """A worker forked by the server, a child of this process; started cold instead
        (and every later one too) when the server cannot fork it."""
        if self._template is None or self._failure is not None:
            return cold(env, cwd)
        read_end, write_end = os.pipe()
        try:
            request = json.dumps({"env": dict(env), "cwd": str(cwd)}).encode()
            socket.send_fds(self._socket, [request], [write_end])
            self._socket.settimeout(ANSWER_TIMEOUT_S)
            pid = int(json.loads(self._socket.recv(MAX_MESSAGE_BYTES))["pid"])
        except (OSError, ValueError, TypeError, KeyError) as exc:
            os.close(read_end)
            self._failure = f"the fork server failed ({type(exc).__name__}: {exc})"
            return cold(env, cwd)
        finally:
            os.close(write_end)
        return Forked(pid, os.fdopen(read_end, "rb"))

    def close(self) -> None:
        """End the server (it ends when its socket closes) and wait for it."""
        self._socket.close()
        self._theirs.close()
        if self._process is None:
            return
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def _fork_worker(env: Mapping[str, str], cwd: Path, output: int) -> int:
    """Fork twice: the worker's pid, once its intermediate parent exited (so that the agent,
    the subreaper, is its parent already)."""
    read_pid, write_pid = os.pipe()
    child = os.fork()
    if child == 0:  # the intermediate: it forks the worker, says its pid, and exits
        try:
            os.close(read_pid)
            intermediate = os.getpid()
            worker = os.fork()
            if worker == 0:
                try:
                    os.close(write_pid)
                    while os.getppid() == intermediate:  # the agent's child first: a worker
                        time.sleep(0.001)  # ties its life to its parent's (_die_with_agent)
                    become_worker(env, cwd, output)
                finally:
                    os._exit(70)  # become_worker never returns
            os.write(write_pid, str(worker).encode())
        finally:
            os._exit(0)
    os.close(write_pid)
    with os.fdopen(read_pid, "rb") as said:
        pid = said.read()
    os.waitpid(child, 0)
    if not pid:
        raise OSError(f"the intermediate process of a worker in {cwd} said no pid")
    return int(pid)


def serve(sock: socket.socket, agent_pid: int) -> None:
    """The server's loop: ready once torch is imported, then one worker per request."""
    if not procs.die_with_parent(agent_pid):
        return  # the agent ended before this process could be tied to it
    template = prepare_template()
    sock.send(json.dumps({"torch": template.torch}).encode())
    while True:
        message, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE_BYTES, 1)
        if not message:
            return  # the agent closed its end
        try:
            request = json.loads(message)
            pid = _fork_worker(request["env"], Path(request["cwd"]), fds[0])
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])), int(sys.argv[2]))
