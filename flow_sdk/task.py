"""The client-side handle of a running or finished task."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, overload

from flow_sdk import payload, protocol
from flow_sdk._config import flow_home
from flow_sdk.errors import (
    RemoteTraceback,
    TaskCancelledError,
    TaskError,
    TaskFailedError,
    TaskNotFoundError,
    TaskTimedOutError,
    TaskTimeoutError,
)
from flow_sdk.protocol import NodeRecord, Outcome, TaskRecord, TaskStatus
from flow_sdk.providers import get_provider
from flow_sdk.providers.base import LogRecord, Provider

LogSource = Literal["workers", "agent", "all"]
_FOLLOW_POLL_S = 0.1
_FOLLOW_SETTLE_S = 0.2  # lines newer than this wait one more poll so streams merge in order


def _client_record_path(task_id: str) -> Any:
    return flow_home() / "tasks" / f"{task_id}.json"


def save_client_record(task_id: str, provider: Provider, extra: dict[str, Any]) -> None:
    """Remember which provider holds a task so ``Task.from_id`` works from any process."""
    path = _client_record_path(task_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"task_id": task_id, "provider": provider.name, "provider_config": provider.config(),
            **extra}
    path.write_text(json.dumps(data, sort_keys=True))


def list_client_records() -> list[dict[str, Any]]:
    folder = flow_home() / "tasks"
    if not folder.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


@dataclass(frozen=True)
class _Line:
    record: LogRecord
    node: int | None
    label: str


class Task:
    """A task launched by ``RemoteFunction.spawn`` (or re-attached with ``Task.from_id``)."""

    def __init__(self, task_id: str, provider: Provider) -> None:
        self.task_id = task_id
        self.provider = provider
        self._torn_down = False

    def __repr__(self) -> str:
        return f"Task({self.task_id!r}, provider={self.provider.name!r})"

    @classmethod
    def from_id(cls, task_id: str) -> Task:
        path = _client_record_path(task_id)
        if not path.exists():
            raise TaskNotFoundError(f"no task {task_id!r} in {path.parent}; `flow list` shows "
                                    "the tasks this machine knows")
        data = json.loads(path.read_text())
        return cls(task_id, get_provider(data["provider"], data["provider_config"]))

    # -- state ------------------------------------------------------------------------------

    def record(self) -> TaskRecord:
        raw = self.provider.store.get(protocol.task_key(self.task_id))
        if raw is None:
            raise TaskNotFoundError(f"task {self.task_id!r} has no record in the "
                                    f"{self.provider.name} store")
        return TaskRecord.from_json(raw)

    def outcome(self) -> Outcome | None:
        raw = self.provider.store.get(protocol.outcome_key(self.task_id))
        return Outcome.from_json(raw) if raw is not None else None

    def nodes(self) -> list[NodeRecord]:
        store = self.provider.store
        return [NodeRecord.from_json(data) for key in store.list(protocol.nodes_prefix(self.task_id))
                if (data := store.get(key)) is not None]

    @property
    def status(self) -> TaskStatus:
        outcome = self.outcome()
        if outcome is not None:
            return TaskStatus(outcome.status)
        if any(n.phase in ("running", "done") for n in self.nodes()):
            return TaskStatus.RUNNING
        instances = self.provider.list_instances(self.task_id)
        if not instances:
            return TaskStatus.PENDING
        if all(i.state == "terminated" for i in instances):
            return self._nodes_vanished()
        return TaskStatus.PROVISIONING

    def _nodes_vanished(self) -> TaskStatus:
        """Every node is gone and none wrote an outcome: record why, once, for every reader."""
        tail = [line for line in self.logs(source="agent", tail=10)]
        message = ("every node exited without reporting an outcome (a node agent crashed or "
                   "was killed)")
        if tail:
            message += "; last agent lines:\n  " + "\n  ".join(tail)
        self.provider.store.put_if_absent(
            protocol.outcome_key(self.task_id),
            protocol.to_json(Outcome(TaskStatus.FAILED.value, message, time.time(),
                                     log_tail=tail)))
        outcome = self.outcome()
        assert outcome is not None
        return TaskStatus(outcome.status)

    def wait(self, timeout: float | None = None) -> TaskStatus:
        """Block until the task ends; returns its terminal status. Tears the nodes down."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while True:
            status = self.status
            if status.is_terminal:
                self._teardown()
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TaskTimeoutError(f"task {self.task_id} is still {status} after "
                                       f"{timeout}s; it keeps running (cancel() stops it)")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _teardown(self) -> None:
        if not self._torn_down:
            self.provider.terminate(self.task_id)
            self._torn_down = True

    def cancel(self) -> None:
        """Stop every worker on every node and tear the nodes down. No-op once the task ended."""
        self.provider.store.put(protocol.cancel_key(self.task_id), b"cancelled by the caller")
        self.provider.store.put_if_absent(
            protocol.outcome_key(self.task_id),
            protocol.to_json(Outcome(TaskStatus.CANCELLED.value, "cancelled by the caller",
                                     time.time())))
        self.provider.terminate(self.task_id)
        self._torn_down = True

    # -- results ----------------------------------------------------------------------------

    def result(self, timeout: float | None = None) -> Any:
        """Rank 0's return value; re-raises a remote exception with its remote traceback."""
        if self.wait(timeout) is not TaskStatus.SUCCEEDED:
            raise self._error()
        return self._load_result(0)

    def results(self, timeout: float | None = None) -> list[Any]:
        """Every rank's return value, by rank."""
        if self.wait(timeout) is not TaskStatus.SUCCEEDED:
            raise self._error()
        keys = self.provider.store.list(protocol.results_prefix(self.task_id))
        return [self._load_result(int(key.rsplit("/", 1)[1])) for key in keys]

    def _load_result(self, rank: int) -> Any:
        raw = self.provider.store.get(protocol.result_key(self.task_id, rank))
        if raw is None:
            raise TaskError(f"task {self.task_id} succeeded but rank {rank} stored no result",
                            task_id=self.task_id, status=TaskStatus.SUCCEEDED.value)
        return payload.loads(raw)

    def _error(self) -> BaseException:
        outcome = self.outcome()
        assert outcome is not None
        status = TaskStatus(outcome.status)
        text = f"task {self.task_id} {status}: {outcome.message}"
        if status is TaskStatus.CANCELLED:
            return TaskCancelledError(text, task_id=self.task_id, status=status.value)
        if status is TaskStatus.TIMED_OUT:
            return TaskTimedOutError(text, task_id=self.task_id, status=status.value)
        if outcome.has_error_payload and outcome.rank is not None:
            raw = self.provider.store.get(protocol.error_key(self.task_id, outcome.rank))
            if raw is not None:
                info = payload.loads(raw)
                where = f"raised on node {outcome.node}, rank {outcome.rank} of task {self.task_id}"
                exc = info.get("exception")
                if isinstance(exc, BaseException):
                    if hasattr(exc, "add_note"):
                        exc.add_note(where)
                    exc.__cause__ = RemoteTraceback(info["traceback"])
                    return exc
                text = f"{info['type']}: {info['message']} ({where})\n{info['traceback']}"
        return TaskFailedError(text, task_id=self.task_id, node=outcome.node, rank=outcome.rank,
                               exit_code=outcome.exit_code, signal_name=outcome.signal_name,
                               log_tail=outcome.log_tail)

    # -- logs -------------------------------------------------------------------------------

    def _streams(self, node: int | None, source: LogSource) -> dict[str, tuple[int | None, str]]:
        """stream name -> (node, label) for the streams selected."""
        by_instance = {n.instance_id: n for n in self.nodes()}
        workers_per_node = {n.node: n.workers for n in by_instance.values()}
        chosen: dict[str, tuple[int | None, str]] = {}
        for stream in self.provider.logs.streams(self.task_id):
            if stream.startswith("node-") and source in ("workers", "all"):
                node_part, rank_part = stream.split(".", 1)
                n = int(node_part.split("-")[1])
                rank = rank_part.split("-")[1]
                label = f"[Node {n}]"
                extra = f" [rank {rank}]" if workers_per_node.get(n, 1) > 1 else ""
                chosen[stream] = (n, label + "\0" + extra)
            elif stream.startswith("agent.") and source in ("agent", "all"):
                instance = stream.split(".", 1)[1]
                rec = by_instance.get(instance)
                n = rec.node if rec is not None else None
                label = f"[Node {n}]" if n is not None else f"[{instance}]"
                chosen[stream] = (n, label + "\0 [agent]")
        return {s: v for s, v in chosen.items() if node is None or v[0] == node}

    @staticmethod
    def _format(line: _Line) -> str:
        head, _, extra = line.label.partition("\0")
        clock = time.strftime("%H:%M:%S", time.localtime(line.record.ts))
        return f"{head} [{clock}]{extra} {line.record.text}"

    @overload
    def logs(self, node: int | None = ..., tail: int | None = ..., follow: Literal[False] = ...,
             since: float | None = ..., source: LogSource = ...) -> list[str]: ...

    @overload
    def logs(self, node: int | None = ..., tail: int | None = ..., *, follow: Literal[True],
             since: float | None = ..., source: LogSource = ...) -> Iterator[str]: ...

    def logs(self, node: int | None = None, tail: int | None = None, follow: bool = False,
             since: float | None = None, source: LogSource = "workers") -> list[str] | Iterator[str]:
        """Log lines labelled ``[Node i] [HH:MM:SS]`` (plus the rank when a node runs several
        workers), merged in time order across nodes. ``since`` is an epoch time. With
        ``follow=True`` returns an iterator that yields new lines until the task ends."""
        if follow:
            return self._follow(node, tail, since, source)
        lines, _ = self._read_new(node, since, source, {})
        lines.sort(key=lambda ln: ln.record.ts)
        if tail is not None:
            lines = lines[-tail:] if tail > 0 else []
        return [self._format(ln) for ln in lines]

    def _read_new(self, node: int | None, since: float | None, source: LogSource,
                  cursors: dict[str, int]) -> tuple[list[_Line], dict[str, int]]:
        lines: list[_Line] = []
        for stream, (n, label) in self._streams(node, source).items():
            records, cursors[stream] = self.provider.logs.read(self.task_id, stream,
                                                               cursors.get(stream, 0))
            lines.extend(_Line(r, n, label) for r in records if since is None or r.ts >= since)
        return lines, cursors

    def _follow(self, node: int | None, tail: int | None, since: float | None,
                source: LogSource) -> Iterator[str]:
        cursors: dict[str, int] = {}
        pending, cursors = self._read_new(node, since, source, cursors)
        pending.sort(key=lambda ln: ln.record.ts)
        if tail is not None:
            pending = pending[-tail:] if tail > 0 else []
        yield from (self._format(ln) for ln in pending)
        pending = []
        while True:
            ended = self.status.is_terminal
            new, cursors = self._read_new(node, since, source, cursors)
            pending.extend(new)
            pending.sort(key=lambda ln: ln.record.ts)
            cutoff = float("inf") if ended else time.time() - _FOLLOW_SETTLE_S
            ready = [ln for ln in pending if ln.record.ts <= cutoff]
            pending = pending[len(ready):]
            yield from (self._format(ln) for ln in ready)
            if ended:
                return
            time.sleep(_FOLLOW_POLL_S)
