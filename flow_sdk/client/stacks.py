"""A task's stacks (``task.stacks()``, ``flow stacks``) and its stalls.

While the task runs, the client writes a numbered stacks request into the task's store; every
node's agent answers within a second or two with one dump per worker. Once it ended, the last
stacks taken while it ran (a stall's, or ones asked for) are what it shows: they stay in the
task's store, sealed with its secret, until its records are collected. The result names the
ranks whose stacks stand apart from the rest (``wire.stacks.odd_ranks``) and renders as a
traceback does (``flow_sdk.wire.tracebacks``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from flow_sdk.errors import RecordError, SignatureError, TaskError
from flow_sdk.spec import TaskSpec
from flow_sdk.wire.tracebacks import render_stacks, stack_text
from flow_sdk.wire import TaskStatus
from flow_sdk.wire.signing import SignedStore
from flow_sdk.wire.stacks import (
    StackDump,
    StacksRequest,
    StallRecord,
    odd_ranks,
    request_numbers,
    stack_dump_key,
    stacks_prefix,
    stacks_request_key,
    stalls_prefix,
)

DEFAULT_TIMEOUT_S = 20.0


class Task(Protocol):
    """What this module reads of a ``Task``."""

    task_id: str

    @property
    def store(self) -> SignedStore: ...

    @property
    def status(self) -> TaskStatus: ...

    @property
    def spec(self) -> TaskSpec: ...

    @property
    def num_instances(self) -> int: ...

    def check_node(self, node: int | None) -> None: ...


@dataclass(frozen=True)
class Stacks:
    """Every requested worker's stacks, by rank, and the ranks that stand apart."""

    task_id: str
    dumps: list[StackDump]
    missing: list[int]  # ranks whose node did not answer in time
    kept: str = ""  # for an ended task: when these stacks were taken, and why

    @property
    def odd_ranks(self) -> list[int]:
        return odd_ranks(self.dumps)

    def by_rank(self) -> dict[int, str]:
        """Each rank's stacks, as ``str(stacks)`` shows them."""
        return {d.rank: stack_text(d) for d in self.dumps}

    def __str__(self) -> str:
        text = (self.kept + "\n" if self.kept else "") + render_stacks(self.dumps,
                                                                     self.odd_ranks)
        if self.missing:
            text += f"\n(no answer from rank(s) {', '.join(map(str, self.missing))})"
        return text


def _request(task: Task, node: int | None) -> int:
    numbers = request_numbers(task.store.list(stacks_prefix(task.task_id)))
    number = (numbers[-1] + 1) if numbers else 1
    while not task.store.put_record_if_absent(
            stacks_request_key(task.task_id, number),
            StacksRequest(number, node, "asked by the caller", time.time())):
        number += 1
    return number


def _ranks(task: Task, node: int | None) -> list[int]:
    slots = task.spec.slots_per_node
    nodes = range(task.num_instances) if node is None else [node]
    return [n * slots + s for n in nodes for s in range(slots)]


def task_stacks(task: Task, node: int | None = None,
                timeout: float = DEFAULT_TIMEOUT_S) -> Stacks:
    """Ask the running task's nodes (or only ``node``) for their workers' stacks and wait
    for them, at most ``timeout`` seconds; of an ended task, the last ones taken while it
    ran (``kept_stacks``)."""
    task.check_node(node)
    if task.status.is_terminal:
        return kept_stacks(task, node)
    ranks = _ranks(task, node)
    number = _request(task, node)
    deadline = time.monotonic() + timeout
    dumps: dict[int, StackDump] = {}
    while True:
        for rank in ranks:
            dump = None if rank in dumps else sealed_dump(task, number, rank)
            if dump is not None:
                dumps[rank] = dump
        if len(dumps) == len(ranks) or time.monotonic() > deadline or task.status.is_terminal:
            break
        time.sleep(0.2)
    return Stacks(task.task_id, [dumps[r] for r in sorted(dumps)],
                  [r for r in ranks if r not in dumps])


def kept_stacks(task: Task, node: int | None = None) -> Stacks:
    """The last stacks taken of the ended task's workers (or only ``node``'s) while it ran:
    at a stall, or asked for. Raises TaskError when none were."""
    ranks = _ranks(task, node)
    for number in reversed(request_numbers(task.store.list(stacks_prefix(task.task_id)))):
        request = sealed_request(task, number)
        if request is None or (request.node is not None and request.node != node):
            continue  # none, forged, or of another node only
        found = {r: d for r in ranks if (d := sealed_dump(task, number, r)) is not None}
        if found:
            taken = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(request.requested_at))
            kept = (f"task {task.task_id} has ended ({task.status}); its last stacks, taken "
                    f"at {taken} ({request.reason}):")
            return Stacks(task.task_id, [found[r] for r in sorted(found)],
                          [r for r in ranks if r not in found], kept)
    raise TaskError(f"task {task.task_id} has ended ({task.status}) and no stacks were taken "
                    "while it ran; `flow stacks` takes them while a task runs, and a stall "
                    "(stall_timeout) keeps the ones it took", task_id=task.task_id,
                    status=str(task.status))


def sealed_request(task: Task, number: int) -> StacksRequest | None:
    """Stacks request ``number``; None when there is none, or for one not sealed with the
    task's secret or not well formed."""
    try:
        raw = task.store.get_record(stacks_request_key(task.task_id, number))
        return None if raw is None else StacksRequest.from_json(raw)
    except (SignatureError, RecordError):
        return None


def sealed_dump(task: Task, number: int, rank: int) -> StackDump | None:
    """Rank ``rank``'s answer to stacks request ``number``; None while there is none, and
    for one not sealed with the task's secret or not well formed (no node wrote it)."""
    try:
        raw = task.store.get_record(stack_dump_key(task.task_id, number, rank))
        return None if raw is None else StackDump.from_json(raw)
    except (SignatureError, RecordError):
        return None


def task_stalls(task: Task) -> list[StallRecord]:
    """The stalls the task's leader saw, oldest first; an object under the stalls' prefix
    that is not a stall record sealed with the task's secret (forged, altered, of another
    shape) is no stall: it is left out."""
    found = []
    for key in task.store.list(stalls_prefix(task.task_id)):
        try:
            raw = task.store.get_record(key)
            stall = None if raw is None else StallRecord.from_json(raw)
        except (SignatureError, RecordError):
            continue
        if stall is not None:
            found.append(stall)
    return sorted(found, key=lambda s: s.number)
