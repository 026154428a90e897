"""The node agent: bootstrap -> rendezvous -> env -> workers -> watch -> results.

Started by a provider on every node with ``FLOW_BOOT`` (task and provider), ``FLOW_INSTANCE_ID``
and ``FLOW_NODE_ADDRESS`` set. It reaches the provider only through the provider interface.

A task runs in generations. Generation 0 starts when every node passed the start barrier.
When a worker fails or a node is lost, exactly one node (the one whose signed claim of the
generation's decider key is in the object store) decides: it writes the task's outcome, or,
while ``max_restarts`` allows, stops the lost nodes, starts replacements and opens the next
generation, in which every node rendezvouses again and restarts its workers.

A node learns its generation's gang from the membership record written by whoever started
the nodes (the launcher for generation 0, the decider for the next); the provider's instance
list is the fallback when that record is absent, stale or forged.
"""

from __future__ import annotations

import enum
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

from flow_sdk import headjob, protocol, sdkwheel, signing
from flow_sdk.agent import clock
from flow_sdk.agent.workers import WorkerExit, WorkerGroup
from flow_sdk.errors import FlowError, SignatureError
from flow_sdk.protocol import (
    BootConfig,
    GangMember,
    MembershipRecord,
    NodeEvent,
    NodePhase,
    NodeRecord,
    Outcome,
    TaskRecord,
    TaskStatus,
)
from flow_sdk.providers import get_provider
from flow_sdk.providers.base import LaunchRequest, LogRecord, Provider
from flow_sdk.rendezvous import Membership, discover, from_record, worker_env
from flow_sdk.rendezvous.preflight import run_preflight
from flow_sdk.rendezvous.store import FailureReport, NodeStore, StoreLost
from flow_sdk.sdkwheel import PythonMismatchError
from flow_sdk.spec import TaskSpec
from flow_sdk.volumes import prepare_volumes

POLL_S = 0.05  # how often workers are polled
WATCH_S = 0.25  # how often the store is read (failures, completion, heartbeats)
HEARTBEAT_TIMEOUT_S = 6.0  # a node whose counter did not move for this long is lost
DECIDE_WINDOW_S = 1.0  # how long the decider collects other nodes' reports
DECISION_WAIT_S = 30.0  # how long other nodes wait for the decider
CANCEL_CHECK_S = 2.0
INTERRUPTION_CHECK_S = 5.0  # how often a node asks its provider for an interruption notice
MEMBERSHIP_GRACE_S = 10.0  # how long a node waits for its generation's membership record
DECIDER_SLOTS = 8  # claim slots per generation: a forged claim in one moves the nodes on


class Next(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RESTART = "restart"


@dataclass(frozen=True)
class WatchResult:
    kind: NodeEvent
    report: FailureReport | None = None  # what this node saw, when it saw the failure itself


class AgentLog:
    """The agent's own lines, to its log stream (and its stdout, the node's boot log)."""

    def __init__(self, provider: Provider, task_id: str, instance_id: str) -> None:
        self._writer = provider.logs.writer(task_id, protocol.agent_stream(instance_id))

    def __call__(self, message: str) -> None:
        now = time.time()
        self._writer.write([LogRecord(now, message)])
        print(f"{time.strftime('%H:%M:%S', time.localtime(now))} {message}", flush=True)

    def event(self, message: str) -> None:
        """A task event (lost node, restart, replacement, generation): the caller shows it
        among the workers' output as an SDK line."""
        self(protocol.EVENT_MARK + message)


class Agent:
    def __init__(self, boot: BootConfig, instance_id: str, address: str, workdir: Path) -> None:
        self.boot = boot
        self.task_id = boot.task_id
        self.instance_id = instance_id
        self.address = address
        self.workdir = workdir
        self.provider = get_provider(boot.provider, boot.provider_config)
        self.secret = signing.secret_from_hex(boot.secret)
        self.store = signing.SignedStore(self.provider.store, self.secret)  # checks every read
        self.log = AgentLog(self.provider, self.task_id, instance_id)
        self.stop_requested = threading.Event()

    # -- records ----------------------------------------------------------------------------

    def _write_node(self, m: Membership, phase: NodePhase, workers: int = 0) -> None:
        record = NodeRecord(m.node_rank, self.instance_id, self.address, phase, time.time(),
                            workers)
        self.store.put_record(protocol.node_key(self.task_id, m.node_rank), record)

    def _write_outcome(self, outcome: Outcome) -> bool:
        wrote = self.store.put_record_if_absent(protocol.outcome_key(self.task_id), outcome)
        if wrote:
            self.log(f"task {outcome.status}: {outcome.message}")
        return wrote

    def _fail(self, message: str, node: int | None = None) -> int:
        self._write_outcome(Outcome(TaskStatus.FAILED.value, message, time.time(), node=node))
        return 1

    def _replaced(self) -> set[str]:
        """Instance ids that a decider replaced: gone, or about to go (a node that decided its
        own replacement terminates itself last), so never members of a later generation."""
        found: set[str] = set()
        for raw in self._restarts().values():
            replaced = json.loads(raw).get("replaced", [])
            found.update(r for r in replaced if isinstance(r, str))
        return found

    def _current_generation(self) -> int:
        return max((int(k.rsplit("/", 1)[1]) for k in self._restarts()), default=0)

    def _restarts(self) -> dict[str, bytes]:
        """The restart decisions that carry the task's MAC, by key; others are ignored."""
        found = {}
        for key in self.store.list(protocol.restarts_prefix(self.task_id)):
            raw = self._checked(key)
            if raw is not None and key.rsplit("/", 1)[1].isdigit():
                found[key] = raw
        return found

    def _checked(self, key: str) -> bytes | None:
        """A record that carries the task's MAC; None when absent or forged (logged)."""
        try:
            return self.store.get_record(key)
        except SignatureError as exc:
            self.log(f"ignored a forged record: {exc}")
            return None

    # -- main -------------------------------------------------------------------------------

    def run(self) -> int:
        self.log(f"agent started on {self.instance_id} ({self.address}), task {self.task_id}")
        try:  # the record's MAC and the payload's digest are checked before either is used
            raw = self.store.get_record(protocol.task_key(self.task_id))
            if raw is None:
                return self._fail(f"node {self.instance_id} found no task record; the launch "
                                  "was incomplete")
            record = TaskRecord.from_json(raw)
            key = protocol.payload_key(record.payload_digest)
            blob = self.provider.store.get(key)
            if blob is None:
                return self._fail(f"payload {record.payload_digest[:16]} is missing from the "
                                  "store")
            signing.same_digest(key, blob, record.payload_digest)
            sdkwheel.require_python(record.python)
        except (SignatureError, PythonMismatchError) as exc:
            return self._fail(f"node {self.instance_id} refused to run the task: {exc}")
        clock.mark_up(self.store, self.task_id, self.instance_id, time.time())
        spec = TaskSpec.model_validate(record.spec)
        (self.workdir / "payload").write_bytes(blob)
        # The cap counts from the task's creation, so a replacement node gets only what is left.
        deadline = (time.monotonic() + record.created_at + spec.max_run_time_hours * 3600
                    - time.time() if spec.max_run_time_hours is not None else None)
        generation = self._current_generation()
        while True:
            step = self._run_generation(generation, spec, record, deadline)
            if step is Next.SUCCEEDED:
                return 0
            if step is Next.FAILED:
                return 1
            generation += 1
            self.log.event(f"generation {generation} is starting (restart {generation} of "
                           f"at most {spec.max_restarts})")

    def _membership(self, gen: int, spec: TaskSpec, timeout_s: float) -> Membership:
        """The generation's membership record when it names this node; otherwise (absent
        after a grace, stale, forged) the provider's instance list, within ``timeout_s``. A
        task that may start with fewer than all its nodes (``min_instances``) learns which
        ones run from that list."""
        if spec.min_instances in (None, spec.num_instances):
            try:
                pushed = from_record(lambda: self._recorded_members(gen), self.instance_id,
                                     min(MEMBERSHIP_GRACE_S, timeout_s))
            except SignatureError as exc:
                self.log(f"refused a forged membership record: {exc}")
                pushed = None
            if pushed is not None:
                self.log(f"membership of generation {gen} from its record")
                return pushed
            self.log(f"no membership record of generation {gen} names this node; asking the "
                     "provider for the task's instances")
        replaced = self._replaced() if gen else set()
        return discover(lambda: [i for i in self.provider.list_instances(self.task_id)
                                 if i.instance_id not in replaced],
                        self.instance_id, expected=spec.num_instances,
                        minimum=spec.min_instances or spec.num_instances,
                        timeout_s=timeout_s)

    def _recorded_members(self, gen: int) -> list[GangMember] | None:
        raw = self.store.get_record(protocol.membership_key(self.task_id, gen))
        return None if raw is None else MembershipRecord.from_json(raw).members

    def _run_generation(self, gen: int, spec: TaskSpec, record: TaskRecord,
                        deadline: float | None) -> Next:
        until = clock.availability_deadline(self.store, self.task_id, spec, gen, time.time())
        grace = min(clock.JOIN_GRACE_S, spec.availability_timeout_s)

        def left(floor: float = grace) -> float:  # of the clock that began at the first agent
            return clock.remaining(until, time.time(), floor)

        try:
            membership = self._membership(gen, spec, left(0.0))
            self._write_node(membership, NodePhase.RENDEZVOUS)
            self.log(f"node {membership.node_rank}/{membership.num_nodes}, leader "
                     f"{membership.leader_address}")
            store = NodeStore.connect(membership, record.rdzv_port, left(),
                                      self.secret, generation=gen)
            store.heartbeat()
            store.barrier("start", left())
            if spec.preflight:
                self.log(run_preflight(store, record.master_port, spec.availability_timeout_s))
        except FlowError as exc:
            self.log(f"rendezvous failed: {exc}")
            self._fail(str(exc))
            return Next.FAILED
        self.log(f"all {membership.num_nodes} nodes arrived; starting {spec.slots_per_node} "
                 f"worker(s)")
        try:  # volumes and S3 mounts: env additions naming where workers find them
            volume_env = prepare_volumes(spec, self.provider, self.workdir, self.task_id,
                                         self.log, keepalive=store.heartbeat)
        except FlowError as exc:
            self.log(f"volumes failed: {exc}")
            step = self._conclude(gen, spec, membership, store, FailureReport(
                node=membership.node_rank, status=TaskStatus.FAILED.value,
                message=f"node {membership.node_rank}: {exc}", observed_at=time.time()))
            store.close()
            return step
        envs = [worker_env(task_id=self.task_id, membership=membership, local_rank=slot,
                           slots_per_node=spec.slots_per_node, master_port=record.master_port,
                           distributed=spec.distributed_mode == "auto", restart_count=gen,
                           max_restarts=spec.max_restarts, user_env={**volume_env, **spec.environment})
                for slot in range(spec.slots_per_node)]
        if spec.run_on == "head":  # the head job's link key, derived from the task's secret
            for env in envs:
                env[headjob.KEY_ENV] = headjob.link_key(self.secret)
        workers = WorkerGroup(workdir=self.workdir, log_store=self.provider.logs,
                              task_id=self.task_id, node_rank=membership.node_rank, envs=envs,
                              pids_file=self.workdir / protocol.WORKER_PGIDS_FILE,
                              payload_digest=record.payload_digest, generation=gen)
        workers.start()
        self._write_node(membership, NodePhase.RUNNING, spec.slots_per_node)
        try:
            result = self._watch(membership, store, workers, deadline)
        finally:
            workers.stop()
        if result.kind is NodeEvent.SUCCEEDED:
            step = Next.SUCCEEDED
        elif result.kind is NodeEvent.STOPPED:
            step = Next.FAILED
        else:
            step = self._conclude(gen, spec, membership, store, result.report)
        store.close()
        self._write_node(membership, {Next.SUCCEEDED: NodePhase.DONE, Next.FAILED: NodePhase.FAILED,
                                      Next.RESTART: NodePhase.RESTARTING}[step],
                         spec.slots_per_node)
        return step

    # -- deciding how a failed generation ends ------------------------------------------------

    def _conclude(self, gen: int, spec: TaskSpec, m: Membership, store: NodeStore,
                  report: FailureReport | None) -> Next:
        if report is not None:
            try:
                store.report_failure(report)
            except StoreLost:
                self.log("the store is gone; deciding on what this node saw")
        decides = self._claim_decider(gen)
        if decides is None:
            self._fail(f"node {m.node_rank}: every decider slot of generation {gen} holds a "
                       "forged claim; nothing can decide how it ends")
            return Next.FAILED
        if decides:
            return self._decide(gen, spec, m, store, report)
        deadline = time.monotonic() + DECISION_WAIT_S
        restart = protocol.restart_key(self.task_id, gen + 1)
        outcome = protocol.outcome_key(self.task_id)
        while time.monotonic() < deadline:
            if self._checked(restart) is not None:
                return Next.RESTART
            if self._checked(outcome) is not None:
                return Next.FAILED
            time.sleep(0.05)
        self._fail(f"node {m.node_rank}: no node decided how generation {gen} ends within "
                   f"{DECISION_WAIT_S:.0f}s")
        return Next.FAILED

    def _claim_decider(self, gen: int) -> bool | None:
        """Whether this node decides how generation ``gen`` ends: the first node to put its
        signed claim in the first slot that holds no forged one (every node walks the slots
        in the same order, so exactly one wins). None when every slot holds a forgery."""
        for slot in range(DECIDER_SLOTS):
            key = protocol.decider_key(self.task_id, gen, slot)
            if self.store.put_record_if_absent(key, {"instance_id": self.instance_id}):
                return True
            if self._checked(key) is not None:  # another node's claim
                return False
        return None

    def _decide(self, gen: int, spec: TaskSpec, m: Membership, store: NodeStore,
                report: FailureReport | None) -> Next:
        time.sleep(DECIDE_WINDOW_S)  # let the other nodes' reports of the same event arrive
        try:
            reports = store.failure_reports()
        except StoreLost:
            reports = []
        if report is not None and report not in reports:
            reports.append(report)
        root = min(reports, key=FailureReport.root_cause_key) if reports else FailureReport(
            node=m.node_rank, status=TaskStatus.FAILED.value, observed_at=time.time(),
            message="a node reported a failure but no report survived")
        cancelled = self._checked(protocol.cancel_key(self.task_id)) is not None
        if root.status == TaskStatus.TIMED_OUT.value or gen >= spec.max_restarts or cancelled:
            restarts = f" after {gen} restart(s)" if gen else ""
            self._write_outcome(Outcome(root.status, root.message + restarts, time.time(),
                                        node=root.node, rank=root.rank,
                                        exit_code=root.exit_code, signal_name=root.signal_name,
                                        log_tail=list(root.log_tail),
                                        has_error_payload=root.has_error_payload))
            return Next.FAILED
        running = {i.instance_id for i in self.provider.list_instances(self.task_id)
                   if i.state == "running"}
        lost = [iid for node, iid in enumerate(m.instance_ids)
                if iid not in running or (root.lost and node == root.node)]
        self.log.event(f"generation {gen} failed ({root.message.splitlines()[0]}); restart "
                 f"{gen + 1} of {spec.max_restarts}"
                 + (f", replacing {', '.join(lost)}" if lost else ""))
        others = [iid for iid in lost if iid != self.instance_id]
        try:
            if others:
                self.provider.terminate_instances(self.task_id, others)
            self.store.put_record(protocol.restart_key(self.task_id, gen + 1),
                                  {"reason": asdict(root), "replaced": lost})
            added = self.provider.add_instances(
                LaunchRequest(self.task_id, spec, self.boot.to_env()), len(lost)) if lost else []
            members = [GangMember(iid, address) for iid, address
                       in zip(m.instance_ids, m.addresses) if iid not in lost]
            self.store.put_record(protocol.membership_key(self.task_id, gen + 1),
                                  MembershipRecord(gen + 1, members + [
                                      GangMember(i.instance_id, i.address) for i in added],
                                      time.time()))
            if self.instance_id in lost:  # this node is the lost one (e.g. a spot interruption):
                self.log.event("this node is being replaced; terminating it")  # goes last
                self.provider.terminate_instances(self.task_id, [self.instance_id])
                return Next.FAILED
        except FlowError as exc:
            self._fail(f"could not restart after {root.message.splitlines()[0]}: {exc}")
            return Next.FAILED
        return Next.RESTART

    # -- watching ---------------------------------------------------------------------------

    def _worker_failure(self, m: Membership, workers: WorkerGroup,
                        exit_: WorkerExit) -> FailureReport:
        error_file = workers.error_path(exit_.rank)
        has_error = error_file.exists()
        if has_error:
            self.store.put_blob(protocol.error_key(self.task_id, exit_.rank),
                                error_file.read_bytes())
        tail = workers.tail(exit_.rank)
        message = f"node {m.node_rank} rank {exit_.rank}: worker {exit_.describe()}"
        if tail:
            message += "; last lines:\n  " + "\n  ".join(tail[-10:])
        return FailureReport(node=m.node_rank, status=TaskStatus.FAILED.value, message=message,
                             observed_at=exit_.observed_at, rank=exit_.rank,
                             exit_code=exit_.returncode if exit_.returncode > 0 else None,
                             signal_name=exit_.signal_name, log_tail=tuple(tail),
                             has_error_payload=has_error)

    def _upload_results(self, workers: WorkerGroup) -> None:
        for w in workers.workers:
            w.join_output(5.0)  # every line is in the log store before the node reports done
            path = workers.result_path(w.rank)
            self.store.put_blob(protocol.result_key(self.task_id, w.rank), path.read_bytes())

    def _watch(self, m: Membership, store: NodeStore, workers: WorkerGroup,
               deadline: float | None) -> WatchResult:
        done = False
        last_watch = last_cancel = last_notice = 0.0
        ask_notices = True
        seen: dict[int, tuple[int, float]] = {}
        try:
            while True:
                if self.stop_requested.is_set():
                    self.log("stop requested (SIGTERM): stopping workers")
                    return WatchResult(NodeEvent.STOPPED)
                for exit_ in workers.poll():
                    if exit_.returncode != 0:
                        report = self._worker_failure(m, workers, exit_)
                        self.log(report.message.splitlines()[0])
                        return WatchResult(NodeEvent.FAILED, report)
                if not done and workers.all_succeeded:
                    self._upload_results(workers)
                    store.mark_done()
                    done = True
                    self.log("all workers on this node succeeded")
                    if not m.is_leader:
                        return WatchResult(NodeEvent.SUCCEEDED)
                now = time.monotonic()
                if now - last_watch >= WATCH_S:
                    last_watch = now
                    if not done:
                        store.heartbeat()
                    if store.failed():
                        self.log("another node failed: stopping workers")
                        return WatchResult(NodeEvent.FAILED)
                    if m.is_leader:
                        finished = store.done_nodes()
                        if len(finished) == m.num_nodes:
                            self._write_outcome(Outcome(TaskStatus.SUCCEEDED.value,
                                                        "every rank returned", time.time()))
                            return WatchResult(NodeEvent.SUCCEEDED)
                        lost = self._lost_node(store, finished, seen, now)
                        if lost is not None:
                            self.log.event(lost.message)
                            return WatchResult(NodeEvent.FAILED, lost)
                    if deadline is not None and now >= deadline:
                        return WatchResult(NodeEvent.FAILED, FailureReport(
                            node=m.node_rank, status=TaskStatus.TIMED_OUT.value,
                            message="the task reached its max_run_time_hours cap and was "
                                    "stopped on the nodes", observed_at=time.time()))
                if ask_notices and not done and now - last_notice >= INTERRUPTION_CHECK_S:
                    last_notice = now
                    try:
                        notice = self.provider.interruption_notice(self.instance_id)
                    except FlowError as exc:
                        ask_notices = False
                        notice = None
                        self.log(f"cannot read interruption notices, not asking again: {exc}")
                    if notice is not None:
                        message = (f"node {m.node_rank} ({self.instance_id}) is being taken "
                                   f"away: {notice}")
                        self.log(message)
                        return WatchResult(NodeEvent.FAILED, FailureReport(
                            node=m.node_rank, status=TaskStatus.FAILED.value, message=message,
                            observed_at=time.time(), lost=True))
                if now - last_cancel >= CANCEL_CHECK_S:
                    last_cancel = now
                    if self._checked(protocol.cancel_key(self.task_id)) is not None:
                        self.log("task cancelled: stopping workers")
                        return WatchResult(NodeEvent.STOPPED)
                time.sleep(POLL_S)
        except StoreLost as exc:
            self.log(str(exc))
            return WatchResult(NodeEvent.FAILED, FailureReport(
                node=0, status=TaskStatus.FAILED.value, message=f"node {m.node_rank}: {exc}",
                observed_at=time.time(), lost=True))

    def _lost_node(self, store: NodeStore, finished: set[int],
                   seen: dict[int, tuple[int, float]], now: float) -> FailureReport | None:
        """The first node whose heartbeat stopped moving for HEARTBEAT_TIMEOUT_S, if any."""
        for node, count in enumerate(store.heartbeats()):
            if node in finished or node == 0:
                continue
            previous = seen.get(node)
            if previous is None or previous[0] != count:
                seen[node] = (count, now)
            elif now - previous[1] > HEARTBEAT_TIMEOUT_S:
                return FailureReport(
                    node=node, status=TaskStatus.FAILED.value,
                    message=f"node {node} ({store.m.instance_ids[node]}, "
                            f"{store.m.addresses[node]}) was lost: no heartbeat for "
                            f"{now - previous[1]:.1f}s",
                    observed_at=time.time() - (now - previous[1]), lost=True)
        return None


def main() -> int:
    boot, instance_id, address = BootConfig.from_env()
    os.environ.pop("FLOW_BOOT", None)  # it carries the task's secret: workers do not inherit it
    agent = Agent(boot, instance_id, address, Path(os.environ.get("FLOW_NODE_WORKDIR", os.getcwd())))

    def on_term(signum: int, frame: FrameType | None) -> None:
        agent.stop_requested.set()

    signal.signal(signal.SIGTERM, on_term)
    try:
        return agent.run()
    except Exception as exc:  # last resort: record why the node died, then exit non-zero
        agent.log("agent crashed:\n" + "".join(traceback.format_exception(exc)))
        agent._fail(f"node agent on {instance_id} crashed: {exc!r}")
        return 70


if __name__ == "__main__":
    sys.exit(main())
