"""The worker processes of one node: start them, stream their output, watch and stop them."""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from flow_sdk import wire
from flow_sdk.system import procs
from flow_sdk.node.agent import spawn as _spawn
from flow_sdk.node.agent.worker import CALL_CODE_FILE
from flow_sdk.providers.base import LogRecord, LogStore
from flow_sdk.wire.loglines import LineSplitter
from flow_sdk.wire import envvars

Spawn = Callable[[Mapping[str, str], Path], _spawn.Process]

TAIL_LINES = 40


@dataclass(frozen=True)
class WorkerExit:
    local_rank: int
    rank: int
    returncode: int
    observed_at: float  # the poll that saw the exit
    pid: int = 0
    alive_at: float = 0.0  # the last poll that saw the worker alive (it exited after)

    @property
    def signal_name(self) -> str | None:
        if self.returncode < 0:
            return signal.Signals(-self.returncode).name
        return None

    def describe(self) -> str:
        if self.signal_name:
            return f"was killed by {self.signal_name}"
        return f"exited with code {self.returncode}"


class _Worker:
    def __init__(self, local_rank: int, rank: int, proc: _spawn.Process,
                 log_store: LogStore, task_id: str, stream: str) -> None:
        self.local_rank = local_rank
        self.rank = rank
        self.proc = proc
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.exit: WorkerExit | None = None
        self.last_line_at: float | None = None  # when it last wrote a line (progress)
        self.first_line_at: float | None = None
        self._writer = log_store.writer(task_id, stream)
        self._pump = threading.Thread(target=self._pump_output, name=f"log-{stream}", daemon=True)
        self._pump.start()

    def _pump_output(self) -> None:
        """Ship the worker's output as it comes, one record per line (``wire.loglines``:
        each update a progress bar redraws with ``\\r`` is a line of its own)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        splitter = LineSplitter()
        while chunk := os.read(fd, 65536):
            self._ship(splitter.feed(chunk))
        self._ship(splitter.finish())
        self._writer.close()

    def _ship(self, lines: list[bytes]) -> None:
        if not lines:
            return
        now = time.time()
        self.last_line_at = now
        if self.first_line_at is None:
            self.first_line_at = now
        texts = [raw.decode("utf-8", errors="replace") for raw in lines]
        self.tail.extend(texts)
        self._writer.write([LogRecord(now, text) for text in texts])

    def join_output(self, timeout_s: float) -> None:
        self._pump.join(timeout_s)


class WorkerGroup:
    """One process per slot, each in a session of its own (so its children can be stopped too)."""

    def __init__(self, *, workdir: Path, log_store: LogStore, task_id: str, node_rank: int,
                 envs: Sequence[Mapping[str, str]], pids_file: Path, payload_digest: str,
                 code_digest: str = "", generation: int = 0,
                 spawn: Spawn = _spawn.cold) -> None:
        """``code_digest``: the call's code, stored apart from its arguments in
        ``workdir/code`` ("" when the payload holds both). ``spawn`` starts one worker
        (``spawn.cold``, or a warm template's ``fork``)."""
        self.workdir = workdir
        self._log_store = log_store
        self._task_id = task_id
        self._node_rank = node_rank
        self._envs = envs
        self._pids_file = pids_file
        self._payload_digest = payload_digest
        self._code_digest = code_digest
        self._spawn = spawn
        self._generation = generation
        self.workers: list[_Worker] = []
        self._polled_at = time.time()  # every worker still running was alive then
        self.stopped_at: float | None = None  # when the agent began stopping them
        self._results = workdir / "results" / f"g{generation}"  # a restart starts clean
        self._results.mkdir(parents=True, exist_ok=True)

    def result_path(self, rank: int) -> Path:
        return self._results / f"result-{rank}"

    def error_path(self, rank: int) -> Path:
        return self._results / f"error-{rank}"

    def progress_path(self, rank: int) -> Path:
        return self._results / f"progress-{rank}"  # ``current.step`` writes it

    def stacks_path(self, rank: int) -> Path:
        return self._results / f"stacks-{rank}"  # the worker's faulthandler writes it

    def stage_path(self, rank: int) -> Path:
        return self._results / f"stage-{rank}"  # the worker writes the stage it reached

    def start(self) -> None:
        for local_rank, extra in enumerate(self._envs):
            # the agent's own count, not the env's: in distributed_mode="manual" the user's
            # environment may set RANK (or FLOW_NODE_RANK) for their own rendezvous
            rank = self._node_rank * len(self._envs) + local_rank
            env = dict(os.environ)
            env.update(extra)
            env.update({"PYTHONUNBUFFERED": "1", envvars.AGENT_PID: str(os.getpid()),
                        envvars.PAYLOAD_PATH: str(self.workdir / "payload"),
                        envvars.PAYLOAD_DIGEST: self._payload_digest,
                        envvars.RESULT_PATH: str(self.result_path(rank)),
                        envvars.ERROR_PATH: str(self.error_path(rank)),
                        envvars.PROGRESS_PATH: str(self.progress_path(rank)),
                        envvars.STACKS_PATH: str(self.stacks_path(rank)),
                        envvars.STAGE_PATH: str(self.stage_path(rank))})
            if self._code_digest:
                env.update({envvars.CALL_CODE_PATH: str(self.workdir / CALL_CODE_FILE),
                            envvars.CALL_CODE_DIGEST: self._code_digest})
            if "RANK" in extra and "TORCHELASTIC_ERROR_FILE" not in extra:  # like torchrun's,
                env["TORCHELASTIC_ERROR_FILE"] = str(  # for torch.distributed.elastic's @record
                    self._results / f"torchelastic-error-{rank}.json")
            proc = self._spawn(env, self.workdir)
            stream = wire.rank_stream(self._node_rank, rank)
            self.workers.append(_Worker(local_rank, rank, proc, self._log_store,
                                        self._task_id, stream))
            with open(self._pids_file, "a") as fh:
                fh.write(f"{proc.pid}\n")

    def poll(self) -> list[WorkerExit]:
        """Workers that exited since the last call."""
        exits = []
        alive_at, now = self._polled_at, time.time()
        for w in self.workers:
            if w.exit is None and w.proc.poll() is not None:
                w.exit = WorkerExit(w.local_rank, w.rank, w.proc.returncode, now, w.proc.pid,
                                    alive_at)
                exits.append(w.exit)
        self._polled_at = now
        return exits

    def failed(self) -> list[WorkerExit]:
        """Every worker that exited with a failure so far (polled again first)."""
        self.poll()
        return [w.exit for w in self.workers if w.exit is not None and w.exit.returncode != 0]

    @property
    def all_succeeded(self) -> bool:
        return all(w.exit is not None and w.exit.returncode == 0 for w in self.workers)

    def tail(self, rank: int) -> list[str]:
        for w in self.workers:
            if w.rank == rank:
                w.join_output(2.0)
                return list(w.tail)
        return []

    def stop(self, grace_s: float = 3.0, keepalive: Callable[[], None] | None = None) -> None:
        """Stop every worker and everything it started: SIGTERM, then SIGKILL after the grace.
        ``keepalive`` is called while it waits (the node's heartbeat)."""
        self.poll()
        self.stopped_at = time.time()
        live = [w for w in self.workers if w.proc.poll() is None]
        for w in live:
            _signal_group(w.proc.pid, signal.SIGTERM)
            _signal_group(w.proc.pid, signal.SIGCONT)  # a stopped worker acts on it too
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(w.proc.poll() is None for w in live):
            if keepalive is not None:
                keepalive()
            time.sleep(0.05)
        for w in self.workers:  # the worker's own children may outlive it: reach its group
            procs.kill_group(w.proc.pid, grace_s=0.0 if w.proc.poll() is None else 0.5)
            w.proc.wait()
        for w in self.workers:
            w.join_output(2.0)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return
