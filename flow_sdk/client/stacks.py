"""A running task's stacks on demand (``task.stacks()``, ``flow stacks``) and its stalls.

The client writes a numbered stacks request into the task's store; every node's agent answers
within a second or two with one dump per worker. The result names the ranks whose stacks
stand apart from the rest (``wire.stacks.odd_ranks``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from flow_sdk.errors import RecordError, SignatureError, TaskError
from flow_sdk.spec import TaskSpec
from flow_sdk.wire import TaskStatus
from flow_sdk.wire.signing import SignedStore
from flow_sdk.wire.stacks import (
    StackDump,
    StacksRequest,
    StallRecord,
    odd_ranks,
    render,
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

    @property
    def odd_ranks(self) -> list[int]:
        return odd_ranks(self.dumps)

    def by_rank(self) -> dict[int, str]:
        return {d.rank: d.text for d in self.dumps}

    def __str__(self) -> str:
        text = render(self.dumps)
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


def task_stacks(task: Task, node: int | None = None,
                timeout: float = DEFAULT_TIMEOUT_S) -> Stacks:
    """Ask the running task's nodes (or only ``node``) for their workers' stacks and wait
    for them, at most ``timeout`` seconds."""
    task.check_node(node)
    if task.status.is_terminal:
        raise TaskError(f"task {task.task_id} has ended ({task.status}); stacks exist only "
                        "while it runs", task_id=task.task_id, status=str(task.status))
    slots = task.spec.slots_per_node
    nodes = range(task.num_instances) if node is None else [node]
    ranks = [n * slots + s for n in nodes for s in range(slots)]
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
