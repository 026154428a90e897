"""One generation's watch over this node's workers and the gang's store, until it ends.

Every ``POLL_S`` the workers are polled; every ``WATCH_S`` the store is read (peers' failures,
completion, heartbeats, the runtime cap); every ``INTERRUPTION_CHECK_S`` the provider is asked
for an interruption notice, and every ``CANCEL_CHECK_S`` the store for a cancel request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from flow_sdk.node.agent.activity import WorkerActivity
from flow_sdk.node.agent.context import NodeContext
from flow_sdk.node.agent.timers import Deadline, Every
from flow_sdk.node.agent.failures import CAP_MESSAGE, worker_failure
from flow_sdk.node.agent.stacks import CHECK_S as STACKS_CHECK_S
from flow_sdk.node.agent.stacks import StacksAnswer
from flow_sdk.node.agent.stall import StallWatch
from flow_sdk.node.agent.worker import WARNING_SIGNAL
from flow_sdk.node.agent.workers import WorkerGroup
from flow_sdk.errors import FlowError
from flow_sdk.system import procs
from flow_sdk.wire import NodePhase, Outcome, TaskStatus
from flow_sdk.node.rendezvous import Membership
from flow_sdk.node.rendezvous.store import FailureReport, NodeStore, StoreLost
from flow_sdk.spec import TaskSpec

POLL_S = 0.05  # how often workers are polled
WATCH_S = 0.25  # how often the store is read (failures, completion, heartbeats)
HEARTBEAT_TIMEOUT_S = 6.0  # a node whose counter did not move for this long is lost
CANCEL_CHECK_S = 2.0
INTERRUPTION_CHECK_S = 5.0  # how often a node asks its provider for an interruption notice


@dataclass(frozen=True)
class Failure:
    """The generation failed; the decider decides whether the task ends or restarts
    (``recovery.conclude``). ``report`` is what this node saw, when it saw the failure."""

    report: FailureReport | None = None


# How a watch ends: DONE (every worker succeeded), CANCELLED (the caller cancelled the task),
# FAILED (stopped: nothing to decide), or a Failure to decide on.
Watched = NodePhase | Failure


class PeerHeartbeats:
    """The leader's view of its peers' heartbeat counters: a counter that did not move for
    HEARTBEAT_TIMEOUT_S is a lost node."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, float]] = {}  # node -> (counter, when it last moved)

    def lost(self, store: NodeStore, finished: set[int], now: float) -> FailureReport | None:
        """The first node whose heartbeat stopped moving, if any."""
        for node, count in enumerate(store.heartbeats()):
            if node in finished or node == 0:
                continue
            previous = self._seen.get(node)
            if previous is None or previous[0] != count:
                self._seen[node] = (count, now)
            elif now - previous[1] > HEARTBEAT_TIMEOUT_S:
                return FailureReport(
                    node=node, status=TaskStatus.FAILED.value,
                    message=f"node {node} ({store.m.instance_ids[node]}, "
                            f"{store.m.addresses[node]}) was lost: no heartbeat for "
                            f"{now - previous[1]:.1f}s",
                    observed_at=time.time() - (now - previous[1]), lost=True, label="infra")
        return None


class Watch:
    """Watches one generation on this node; ``run`` returns how the watch ended."""

    def __init__(self, node: NodeContext, m: Membership, store: NodeStore,
                 workers: WorkerGroup, cap: Deadline | None, spec: TaskSpec,
                 offset: float = 0.0) -> None:
        """``offset``: seconds from this node's clock to the leader's."""
        self.node, self.m, self.store, self.workers, self.cap = node, m, store, workers, cap
        self.offset = offset
        self.answer = StacksAnswer(node.records.store, node.task_id, node.log)
        self.answer_check = Every(STACKS_CHECK_S)
        self.stall = StallWatch(node, m, store, spec, workers, offset, self.answer)
        self.done = False  # every worker on this node succeeded and its results are stored
        self.peers = PeerHeartbeats()
        self.store_check = Every(WATCH_S)
        self.notice_check: Every | None = Every(INTERRUPTION_CHECK_S)  # None: cannot ask
        self.cancel_check = Every(CANCEL_CHECK_S)
        self.activity = WorkerActivity(node, m, workers)

    def run(self) -> Watched:
        try:
            while True:
                ended = self._step()
                if ended is not None:
                    return ended
                time.sleep(POLL_S)
        except StoreLost as exc:
            self.node.log(str(exc))
            return Failure(FailureReport(
                node=0, status=TaskStatus.FAILED.value, message=f"node {self.m.node_rank}: {exc}",
                observed_at=time.time() + self.offset, lost=True, label="infra"))

    def _step(self) -> Watched | None:
        if self.node.stop_requested.is_set():
            self.node.log("stop requested (SIGTERM): stopping workers")
            return NodePhase.FAILED
        ended = self._check_workers()
        if ended is not None:
            return ended
        if self.node.warned.is_set():
            self.node.warned.clear()
            self._note_warning()
        now = time.monotonic()
        self.activity.check(now)
        for check in (self._check_store, self._check_notice, self._check_cancel,
                      self._check_stacks):
            ended = check(now)
            if ended is not None:
                return ended
        return None

    def _note_warning(self) -> None:
        """The scheduler warned the whole job that its time limit is near: say which of
        this node's workers catch the warning (a checkpoint handler), and which ignore it."""
        live = [w for w in self.workers.workers if w.proc.poll() is None]
        catch = [w.rank for w in live if procs.catches(w.proc.pid, WARNING_SIGNAL)]
        deaf = [w.rank for w in live if w.rank not in catch]
        said = [f"rank {', '.join(map(str, catch))} catches it" if catch else "",
                f"rank {', '.join(map(str, deaf))} does not" if deaf else ""]
        self.node.log.event(f"node {self.m.node_rank}: the scheduler warned that the job's "
                            f"time limit is near ({WARNING_SIGNAL.name}); "
                            + "; ".join(part for part in said if part))

    def _check_workers(self) -> Watched | None:
        for exit_ in self.workers.poll():
            if exit_.returncode != 0:
                report = worker_failure(exit_, self.workers, self.m.node_rank, self.offset,
                                        self.node.kernel)
                self.node.log(report.message.splitlines()[0])
                return Failure(report)
        if not self.done and self.workers.all_succeeded:
            self._upload_results()
            self.store.mark_done()
            self.done = True
            self.node.log("all workers on this node succeeded")
            if not self.m.is_leader:
                return NodePhase.DONE
        return None

    def _check_store(self, now: float) -> Watched | None:
        # a leader whose own workers are done asks its (local) store at every step, so the
        # outcome follows the last node's DONE at once
        if not self.store_check.due(now) and not (self.m.is_leader and self.done):
            return None
        if not self.done:
            self.store.heartbeat()
        if self.store.failed():
            self.node.log("another node failed: stopping workers")
            return Failure()
        if self.m.is_leader:
            finished = self.store.done_nodes()
            if len(finished) == self.m.num_nodes:
                self.node.records.write_outcome(Outcome(TaskStatus.SUCCEEDED.value,
                                                        "every rank returned", time.time()))
                return NodePhase.DONE
            lost = self.peers.lost(self.store, finished, now)
            if lost is not None:
                self.node.log.event(lost.message)
                return Failure(lost)
        if self.cap is not None and self.cap.passed(now):
            return Failure(FailureReport(
                node=self.m.node_rank, status=TaskStatus.TIMED_OUT.value,
                message=CAP_MESSAGE, observed_at=time.time() + self.offset, label="user"))
        return None

    def _check_notice(self, now: float) -> Watched | None:
        if self.notice_check is None or self.done or not self.notice_check.due(now):
            return None
        try:
            notice = self.node.provider.interruption_notice(self.node.instance_id)
        except FlowError as exc:
            self.notice_check = None
            self.node.log(f"cannot read interruption notices, not asking again: {exc}")
            return None
        if notice is None:
            return None
        message = (f"node {self.m.node_rank} ({self.node.instance_id}) is being taken away: "
                   f"{notice}")
        self.node.log(message)
        return Failure(FailureReport(node=self.m.node_rank, status=TaskStatus.FAILED.value,
                                     message=message, observed_at=time.time() + self.offset,
                                     lost=True, label="infra"))

    def _check_stacks(self, now: float) -> Watched | None:
        """Answer stacks requests; judge stalls (the leader)."""
        if self.answer_check.due(now):
            self.answer.check(self.workers, self.m.node_rank)
            self.mark_first_line()
        if self.done:
            return None
        stalled = self.stall.check(now)
        return Failure(stalled) if stalled is not None else None

    def mark_first_line(self) -> None:
        """The timeline's first worker line: the earliest line of any of this node's
        workers, once there is one."""
        lines = [w.first_line_at for w in self.workers.workers if w.first_line_at]
        if lines:
            self.node.timeline.mark("first_worker_line", at=min(lines))

    def _check_cancel(self, now: float) -> Watched | None:
        if self.cancel_check.due(now) and self.node.records.cancelled():
            self.node.log("task cancelled: stopping workers")
            return NodePhase.CANCELLED
        return None

    def _upload_results(self) -> None:
        for w in self.workers.workers:
            w.join_output(5.0)  # every line is in the log store before the node reports done
            self.node.records.put_result(w.rank, self.workers.result_path(w.rank).read_bytes())
