"""Stall detection: a rank that makes no progress for ``stall_timeout`` is stalled.

Progress is a worker's output (any line) and the steps it reports with ``current.step(n)``.
Every node publishes its ranks' last progress (on the leader's clock) and median step interval
in the gang's store; the leader judges. On a stall it asks every node for its workers' stacks
(a stacks request in the task's store), names the ranks whose stacks stand apart from the rest
(``wire.stacks.odd_ranks``), writes a ``StallRecord``, shows an event in the task's output and,
with ``on_stall="fail"``, fails the generation with the stall as its cause.

"auto" stays at most half of ``collective_timeout``: a rank that stops while its peers wait in a
collective is named before their collectives time out. When the generation ends later (those
timeouts, the runtime cap), each node reports its ranks that a stall found standing apart and
that made no progress since as failures timed at their last progress: the root cause, with the
timed-out ranks as its consequences.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

from flow_sdk.errors import FlowError, RecordError, SignatureError
from flow_sdk.node.agent.context import NodeContext
from flow_sdk.node.agent.stacks import StacksAnswer
from flow_sdk.node.agent.workers import WorkerGroup
from flow_sdk.node.rendezvous import Membership
from flow_sdk.node.rendezvous.store import FailureReport, NodeStore
from flow_sdk.spec import TaskSpec
from flow_sdk.wire.tracebacks import innermost, render_stacks
from flow_sdk.wire import TaskStatus
from flow_sdk.wire.stacks import (
    StackDump,
    StacksRequest,
    StallRecord,
    odd_ranks,
    stack_dump_key,
    stacks_request_key,
    stall_key,
    stalls_prefix,
)

CHECK_S = 1.0  # how often progress is published and judged
AUTO_FLOOR_S = 120.0  # "auto": at least 2 minutes ...
AUTO_STEPS = 5  # ... or 5 median step intervals ...
AUTO_SHARE = 0.5  # ... but at most this share of the collective timeout
STACKS_WAIT_S = 15.0  # how long the leader waits for every rank's stacks
# A rank with no progress yet (imports, init) gets at least this long, but no more than
# "auto" would give it: its peers wait for it in ``init_process_group``.
STARTUP_GRACE_S = 60.0
SAME_PROGRESS_S = 1e-3  # progress times this close are the same (they cross the store as JSON)


def _read_step(path: str) -> tuple[int, float] | None:
    try:
        with open(path, encoding="ascii") as fh:
            words = fh.read(64).split()
        return int(words[0]), float(words[1])
    except (OSError, ValueError, IndexError):
        return None


class RankProgress:
    """This node's ranks: when each last made progress, and its step intervals."""

    def __init__(self, workers: WorkerGroup, offset: float) -> None:
        self.workers, self.offset = workers, offset
        self.started_at = time.time()
        self._steps: dict[int, tuple[int, float]] = {}
        self._intervals: dict[int, list[float]] = {}

    def last_progress(self) -> dict[int, float]:
        """rank -> when it last made progress (leader's clock), for every worker."""
        found = {}
        for w in self.workers.workers:
            step = self._steps.get(w.rank, (0, 0.0))[1]
            found[w.rank] = max(self.started_at, w.last_line_at or 0.0, step) + self.offset
        return found

    def sample(self) -> dict[str, list[float | None]]:
        """rank -> [last progress (leader's clock, its start before any), median step
        interval or None, 1.0 once it made progress], for the ranks still running."""
        found: dict[str, list[float | None]] = {}
        for w in self.workers.workers:
            if w.proc.poll() is not None:
                continue
            step = _read_step(str(self.workers.progress_path(w.rank)))
            if step is not None and self._steps.get(w.rank, (None, 0.0))[0] != step[0]:
                previous = self._steps.get(w.rank)
                if previous is not None:
                    self._intervals.setdefault(w.rank, []).append(step[1] - previous[1])
                self._steps[w.rank] = step
            progressed = max(w.last_line_at or 0.0, self._steps.get(w.rank, (0, 0.0))[1])
            intervals = self._intervals.get(w.rank)
            found[str(w.rank)] = [max(self.started_at, progressed) + self.offset,
                                  statistics.median(intervals) if intervals else None,
                                  1.0 if progressed else 0.0]
        return found


@dataclass
class _Pending:
    number: int
    ranks: list[int]
    since: dict[int, float]  # rank -> its last progress (leader's clock)
    idle_s: float
    timeout_s: float
    asked_at: float


def auto_timeout(collective_timeout_s: float, intervals: list[float]) -> float:
    """"auto": the larger of ``AUTO_FLOOR_S`` and ``AUTO_STEPS`` median step intervals, at most
    ``AUTO_SHARE`` of the collective timeout."""
    wanted = max([AUTO_FLOOR_S] + ([AUTO_STEPS * statistics.median(intervals)]
                                   if intervals else []))
    return min(wanted, AUTO_SHARE * collective_timeout_s)


class StallWatch:
    """Publishes this node's progress; on the leader, judges stalls and acts on them."""

    def __init__(self, node: NodeContext, m: Membership, store: NodeStore, spec: TaskSpec,
                 workers: WorkerGroup, offset: float, answer: StacksAnswer) -> None:
        self.node, self.m, self.store, self.spec = node, m, store, spec
        self.progress = RankProgress(workers, offset)
        self.answer = answer
        self.next_check = 0.0
        self.pending: _Pending | None = None
        self.reported: dict[int, float] = {}  # rank -> the progress time a stall was shown at

    def check(self, now: float) -> FailureReport | None:
        if self.spec.stall_timeout == "off" or now < self.next_check:
            return None
        self.next_check = now + CHECK_S
        self.store.publish("progress", json.dumps(self.progress.sample()))
        if not self.m.is_leader:
            return None
        if self.pending is not None:
            return self._conclude()
        self._judge()
        return None

    def _timeout(self, intervals: list[float]) -> float:
        if isinstance(self.spec.stall_timeout, float):
            return self.spec.stall_timeout
        return auto_timeout(self.spec.collective_timeout, intervals)

    def _judge(self) -> None:
        ranks: dict[int, float] = {}
        starting: set[int] = set()  # no output and no step yet: importing, initialising
        intervals: list[float] = []
        for raw in self.store.gather("progress"):
            for rank, (at, interval, progressed) in json.loads(raw or "{}").items():
                ranks[int(rank)] = at
                if not progressed:
                    starting.add(int(rank))
                if interval is not None:
                    intervals.append(interval)
        timeout, leader_now = self._timeout(intervals), time.time()
        grace = max(timeout, min(STARTUP_GRACE_S, AUTO_SHARE * self.spec.collective_timeout))
        stalled = sorted(r for r, at in ranks.items() if self.reported.get(r) != at and
                         leader_now - at > (grace if r in starting else timeout))
        if not stalled:
            return
        idle = leader_now - min(ranks[r] for r in stalled)
        number = self._request(f"rank(s) {', '.join(map(str, stalled))} made no progress for "
                               f"{idle:.0f}s")
        self.reported.update({r: ranks[r] for r in stalled})
        self.pending = _Pending(number, stalled, {r: ranks[r] for r in stalled}, idle, timeout,
                                time.monotonic())

    def _request(self, reason: str) -> int:
        store, task_id = self.node.records.store, self.node.task_id
        number = self.answer.next
        while not store.put_record_if_absent(stacks_request_key(task_id, number), StacksRequest(
                number, None, reason, time.time())):
            number += 1
        return number

    def _dumps(self, number: int) -> list[StackDump]:
        store, task_id = self.node.records.store, self.node.task_id
        found = []
        for rank in range(self.m.num_nodes * self.spec.slots_per_node):
            raw = store.get_record(stack_dump_key(task_id, number, rank))
            if raw is not None:
                found.append(StackDump.from_json(raw))
        return found

    def _conclude(self) -> FailureReport | None:
        pending = self.pending
        assert pending is not None
        dumps = self._dumps(pending.number)
        expected = self.m.num_nodes * self.spec.slots_per_node
        if len(dumps) < expected and time.monotonic() - pending.asked_at < STACKS_WAIT_S:
            return None
        self.pending = None
        return self._act(pending, dumps)

    def _act(self, pending: _Pending, dumps: list[StackDump]) -> FailureReport | None:
        odd = odd_ranks(dumps)
        message = stall_message(pending.ranks, pending.idle_s, pending.timeout_s, odd, dumps)
        action = self.spec.on_stall
        record = StallRecord(pending.number, pending.ranks, odd, pending.idle_s,
                             pending.timeout_s, pending.number, action, message, time.time(),
                             {"since": {str(r): at for r, at in pending.since.items()}})
        try:
            self.node.records.store.put_record(stall_key(self.node.task_id, pending.number),
                                               record)
        except FlowError as exc:
            self.node.log(f"could not record the stall: {exc}")
        self.node.log.event(message + f" (on_stall={action}; `flow stacks` shows every rank)")
        if action != "fail":
            return None
        named = odd or pending.ranks
        shown = [d for d in dumps if d.rank in named]
        slots = self.spec.slots_per_node
        return FailureReport(node=named[0] // slots, status=TaskStatus.FAILED.value,
                             message=message + "\n" + render_stacks(shown),
                             observed_at=pending.since.get(named[0], time.time()),
                             rank=named[0], label="user")

    def stood_apart(self, skip: set[int]) -> list[FailureReport]:
        """This node's live ranks (but ``skip``) that a recorded stall found standing apart and
        that made no progress since, each as a failure timed at its last progress: what it
        caused (its peers' collective timeouts, the runtime cap) comes after it. Asked when the
        generation ends, before the workers are stopped."""
        if self.spec.stall_timeout == "off":
            return []
        live = {w.rank for w in self.progress.workers.workers if w.proc.poll() is None} - skip
        if not live:
            return []
        last = self.progress.last_progress()
        found: dict[int, FailureReport] = {}
        try:
            for record in self._recorded():
                since = record.extra.get("since")
                for rank in record.odd_ranks:
                    at = since.get(str(rank)) if isinstance(since, dict) else None
                    if (rank in live and rank not in found and isinstance(at, (int, float))
                            and not isinstance(at, bool) and last[rank] <= at + SAME_PROGRESS_S):
                        found[rank] = self._stood_apart(record, rank, last[rank])
        except (FlowError, OSError) as exc:
            self.node.log(f"could not read the task's stalls: {exc}")
        return [found[rank] for rank in sorted(found)]

    def _recorded(self) -> list[StallRecord]:
        """The stalls in the task's store, oldest first; anything else there is left out."""
        store, found = self.node.records.store, []
        for key in store.list(stalls_prefix(self.node.task_id)):
            try:
                raw = store.get_record(key)
                if raw is not None:
                    found.append(StallRecord.from_json(raw))
            except (SignatureError, RecordError) as exc:
                self.node.log(f"left out {key}: {exc}")
        return sorted(found, key=lambda s: s.number)

    def _stood_apart(self, record: StallRecord, rank: int, since: float) -> FailureReport:
        """Rank ``rank`` of this node as the root cause: a stall, since when, its stack."""
        raw = self.node.records.store.get_record(
            stack_dump_key(self.node.task_id, record.stacks_request, rank))
        idle = time.time() + self.progress.offset - since
        message = (f"stall: rank {rank} made no progress since "
                   f"{time.strftime('%H:%M:%S', time.gmtime(since))} UTC ({idle:.0f}s) and "
                   f"stood apart from the other ranks; stall check {record.number}: "
                   f"{record.message.removeprefix('stall: ')}")
        if raw is not None:
            message += "\n" + render_stacks([StackDump.from_json(raw)])
        return FailureReport(node=self.m.node_rank, status=TaskStatus.FAILED.value,
                             message=message, observed_at=since, rank=rank, label="user")


def stall_message(ranks: list[int], idle_s: float, timeout_s: float, odd: list[int],
                  dumps: list[StackDump]) -> str:
    """One line: who stalled, for how long, and which ranks stand apart and where they are."""
    text = (f"stall: rank(s) {', '.join(map(str, ranks))} made no progress for {idle_s:.0f}s "
            f"(stall_timeout {timeout_s:g}s)")
    if not dumps:
        return text + "; no stacks arrived"
    by_rank = {d.rank: d for d in dumps}
    if odd:
        where = "; ".join(f"rank {r} in {innermost(by_rank[r])}" for r in odd if r in by_rank)
        waiting = [d for d in dumps if d.rank not in odd and d.in_collective()]
        text += f"; stands apart: {where}"
        if waiting:
            text += (f"; ranks {', '.join(str(d.rank) for d in waiting)} wait in a collective "
                     f"({innermost(waiting[0])})")
    else:
        text += f"; every rank is at the same place ({innermost(dumps[0])})"
    return text
