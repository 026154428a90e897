"""One generation on this node: rendezvous, start the workers, watch them, and how it ended.

A node learns its generation's gang from the membership record written by whoever started
the nodes (the launcher for generation 0, the decider for the next); the provider's instance
list is the fallback when that record is absent, stale or forged.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from flow_sdk.system import procs
from flow_sdk.node import headjob
from flow_sdk.node.collectives import collective_env
from flow_sdk.node.agent import clock
from flow_sdk.node.agent.activity import STARTING
from flow_sdk.node.agent.context import NodeContext
from flow_sdk.node.agent.failures import (
    Keepalive,
    first_with_others,
    node_failures,
    stopped_workers,
)
from flow_sdk.node.agent.recovery import conclude
from flow_sdk.node.agent.timers import Deadline
from flow_sdk.node.agent.watch import Watch, Watched
from flow_sdk.node.agent import spawn
from flow_sdk.node.agent.workers import Spawn, WorkerGroup
from flow_sdk.errors import FlowError, SignatureError
from flow_sdk.wire import NodePhase, TaskRecord, TaskStatus
from flow_sdk.node.rendezvous import Membership, discover, from_record, worker_env
from flow_sdk.node.rendezvous.preflight import run_preflight
from flow_sdk.node.rendezvous.store import FailureReport, NodeStore
from flow_sdk.spec import TaskSpec
from flow_sdk.node.volumes.prepare import prepare_volumes
from flow_sdk.wire.timeline import generation_phase
from flow_sdk.wire import envvars

MEMBERSHIP_GRACE_S = 10.0  # how long a node waits for its generation's membership record


def membership(node: NodeContext, gen: int, spec: TaskSpec, timeout_s: float) -> Membership:
    """The generation's membership record when it names this node; otherwise (absent after a
    grace, stale, forged) the provider's instance list, within ``timeout_s``. A task that may
    start with fewer than all its nodes (``min_instances``) learns which ones run from that
    list."""
    if spec.min_instances in (None, spec.num_instances):
        try:
            pushed = from_record(lambda: node.records.members(gen), node.instance_id,
                                 min(MEMBERSHIP_GRACE_S, timeout_s))
        except SignatureError as exc:
            node.log(f"refused a forged membership record: {exc}")
            pushed = None
        if pushed is not None:
            node.log(f"membership of generation {gen} from its record")
            return pushed
        node.log(f"no membership record of generation {gen} names this node; asking the "
                 "provider for the task's instances")
    replaced = node.records.replaced() if gen else set()
    return discover(lambda: [i for i in node.gang.instances()
                             if i.instance_id not in replaced],
                    node.instance_id, expected=spec.num_instances,
                    minimum=spec.min_instances or spec.num_instances, timeout_s=timeout_s)


class Generation:
    """Generation ``number`` of the task on this node."""

    def __init__(self, node: NodeContext, number: int, spec: TaskSpec,
                 record: TaskRecord) -> None:
        self.node, self.number, self.spec, self.record = node, number, spec, record

    def run(self, cap: Deadline | None) -> NodePhase:
        """How the generation ended on this node: DONE, FAILED or RESTARTING."""
        joined = self._rendezvous()
        if joined is None:
            return NodePhase.FAILED
        m, store = joined
        try:  # volumes and S3 mounts: env additions naming where workers find them
            volume_env = prepare_volumes(self.spec, self.node.provider, self.node.workdir,
                                         self.node.task_id, self.node.log,
                                         keepalive=store.heartbeat)
        except FlowError as exc:
            self.node.log(f"volumes failed: {exc}")
            ended = conclude(self.node, self.number, self.spec, m, store, FailureReport(
                node=m.node_rank, status=TaskStatus.FAILED.value,
                message=f"node {m.node_rank}: {exc}", observed_at=time.time(), label="infra"))
            store.close()
            return ended
        offset = store.clock_offset()
        workers = self._start_workers(m, volume_env, store.heartbeat)
        watch = Watch(self.node, m, store, workers, cap, self.spec, offset)
        watched: Watched = NodePhase.FAILED  # what the finally sees when the watch raised
        try:
            watched = watch.run()
        finally:
            silent = stopped_workers(workers, m.node_rank, watch.stall.progress)
            if not isinstance(watched, NodePhase):  # a failure: a stall may stand behind it
                silent += watch.stall.stood_apart({r.rank for r in silent if r.rank is not None})
            workers.stop(keepalive=Keepalive(store).beat)  # the decider counts on its beats
            watch.mark_first_line()
        ended = watched if isinstance(watched, NodePhase) else conclude(
            self.node, self.number, self.spec, m, store,
            self._report(watched.report, workers, m, offset, silent))
        if ended is NodePhase.FAILED and self.node.records.ended_cancelled():
            ended = NodePhase.CANCELLED
        store.close()
        self.node.records.write_node(m, ended, self.spec.slots_per_node)
        return ended

    def _report(self, seen: FailureReport | None, workers: WorkerGroup, m: Membership,
                offset: float, silent: list[FailureReport]) -> FailureReport | None:
        """What this node reports: its earliest failure, with its later ones. Its workers'
        failures are read again after they were stopped (a node that saw a peer's failure
        first still reports its own), each error payload stored for the caller."""
        own = node_failures(workers, m.node_rank, offset, self.node.kernel)
        for report in own:
            if report.has_error_payload and report.rank is not None:
                self.node.records.put_error(
                    report.rank, workers.error_path(report.rank).read_bytes())
        others = [seen] if seen is not None and not any(
            (r.node, r.rank) == (seen.node, seen.rank) for r in own + silent) else []
        return first_with_others(own + silent + others)

    def _rendezvous(self) -> tuple[Membership, NodeStore] | None:
        """This node's place in the gang and the gang's store, once every node passed the
        start barrier; None (the task's outcome written) when that failed."""
        node, spec = self.node, self.spec
        until = clock.availability_deadline(node.records.store, node.task_id, spec,
                                            self.number, time.time())
        grace = min(clock.JOIN_GRACE_S, spec.availability_timeout_s)

        def left(floor: float = grace) -> float:  # of the clock that began at the first agent
            return clock.remaining(until, time.time(), floor)

        try:
            m = membership(node, self.number, spec, left(0.0))
            node.timeline.set_node(m.node_rank)
            node.timeline.mark("joined")
            node.records.write_node(m, NodePhase.RENDEZVOUS)
            node.log(f"node {m.node_rank}/{m.num_nodes}, leader {m.leader_address}")
            store = NodeStore.connect(m, self.record.rdzv_port, left(), node.secret,
                                      generation=self.number)
            store.heartbeat()
            store.barrier("start", left())
            node.timeline.mark(generation_phase(self.number) if self.number
                               else "barrier_released")
            if spec.preflight:
                node.log(run_preflight(store, self.record.master_port,
                                       spec.availability_timeout_s))
        except FlowError as exc:
            node.log(f"rendezvous failed: {exc}")
            node.records.fail(str(exc), "infra")
            return None
        node.log(f"all {m.num_nodes} nodes arrived; starting {spec.slots_per_node} worker(s)")
        return m, store

    def _spawn(self, envs: list[dict[str, str]], keepalive: Callable[[], None]) -> Spawn:
        """Fork the workers from the node's warm template when it has one that can start
        them, else start them cold; the task's log says which, and why. ``keepalive``: called
        every second while the template gets ready."""
        template = self.node.template
        if template is None:
            return spawn.cold
        env = {**os.environ, **envs[0]}
        problem = template.problem(env) or template.ready(keepalive)
        if problem is not None:
            self.node.log(f"cold start: the warm template cannot start these workers: "
                          f"{problem}")
            return spawn.cold
        self.node.log(f"workers fork from the node's {template.describe()} template")
        return template.fork

    def _start_workers(self, m: Membership, volume_env: dict[str, str],
                       keepalive: Callable[[], None]) -> WorkerGroup:
        node, spec = self.node, self.spec
        envs = [worker_env(task_id=node.task_id, membership=m, local_rank=slot,
                           slots_per_node=spec.slots_per_node,
                           master_port=self.record.master_port,
                           distributed=spec.distributed_mode == "auto",
                           restart_count=self.number, max_restarts=spec.max_restarts,
                           user_env={**collective_env(spec.collective_timeout,
                                                      spec.environment),
                                     **volume_env, **spec.environment})
                for slot in range(spec.slots_per_node)]
        for env in envs:  # the head job's link key, derived from the task's secret: set only
            env.pop(envvars.HEAD_JOB_KEY, None)  # here, and only when the task runs on its head
            if spec.run_on == "head":
                env[envvars.HEAD_JOB_KEY] = headjob.link_key(node.secret)
        workers = WorkerGroup(workdir=node.workdir, log_store=node.provider.logs,
                              task_id=node.task_id, node_rank=m.node_rank, envs=envs,
                              pids_file=node.workdir / procs.WORKER_PGIDS_FILE,
                              payload_digest=self.record.payload_digest,
                              code_digest=self.record.code_digest,
                              generation=self.number, spawn=self._spawn(envs, keepalive))
        workers.start()
        node.records.write_node(m, NodePhase.RUNNING, spec.slots_per_node, STARTING)
        return workers
