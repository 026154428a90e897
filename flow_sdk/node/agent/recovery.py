"""How a failed generation ends: the task's outcome, or the next generation.

Exactly one node decides: the one whose signed claim of the generation's decider key is in the
object store. It collects the other nodes' failure reports for a moment and names the root
cause; then it writes the task's outcome or, while ``max_restarts`` allows, stops the lost
nodes, starts replacements and writes the next generation's restart decision and membership.
The other nodes wait for that decision.
"""

from __future__ import annotations

import time

from flow_sdk import wire
from flow_sdk.node.agent.context import NodeContext
from flow_sdk.node.agent.failures import consequences, root_cause
from flow_sdk.node.agent.timers import Deadline
from flow_sdk.errors import FlowError
from flow_sdk.wire import GangMember, NodePhase, Outcome, TaskStatus
from flow_sdk.node.rendezvous import Membership
from flow_sdk.node.rendezvous.store import FailureReport, NodeStore, StoreLost
from flow_sdk.spec import TaskSpec

DECIDE_WINDOW_S = 1.5  # how long the decider collects other nodes' reports
# A node whose instance still runs but whose agent stays silent this long while the others
# wait for the decision is lost (the watch's heartbeat timeout, for the same reason).
SILENT_AFTER_S = 6.0
WAITING_BEAT_S = 0.25  # how often a node heartbeats while it waits for the decision
DECISION_WAIT_S = 30.0  # how long other nodes wait for the decider


def conclude(node: NodeContext, gen: int, spec: TaskSpec, m: Membership, store: NodeStore,
             report: FailureReport | None) -> NodePhase:
    """How failed generation ``gen`` ends on this node: FAILED or RESTARTING. ``report`` is
    what this node saw, when it saw the failure itself."""
    if report is not None:
        try:
            store.report_failure(report)
        except StoreLost:
            node.log("the store is gone; deciding on what this node saw")
    if claim_decider(node, gen):
        return _decide(node, gen, spec, m, store, report)
    return _await_decision(node, gen, m, store)


def claim_decider(node: NodeContext, gen: int) -> bool:
    """Whether this node decides how generation ``gen`` ends: the first node to put its signed
    claim in the first slot that holds no forged one (every node walks the slots in the same
    order, so exactly one wins; the slots have no end, so forgeries never keep it out)."""
    slot = 0
    while (claimed := node.records.claim(wire.decider_key(node.task_id, gen, slot))) is None:
        slot += 1
    return claimed


def _await_decision(node: NodeContext, gen: int, m: Membership, store: NodeStore
                    ) -> NodePhase:
    """Wait for the decider's word, heartbeating so that it knows this node is alive."""
    wait = Deadline.after(DECISION_WAIT_S)
    beat = 0.0
    while not wait.passed():
        if node.records.restart_decided(gen + 1):
            return NodePhase.RESTARTING
        if node.records.outcome_written():
            return NodePhase.FAILED
        if time.monotonic() >= beat:
            beat = time.monotonic() + WAITING_BEAT_S
            try:
                store.heartbeat()
            except StoreLost:
                beat = float("inf")  # the leader is gone: the decider knows without it
        time.sleep(0.05)
    node.records.fail(f"node {m.node_rank}: no node decided how generation {gen} ends within "
                      f"{DECISION_WAIT_S:.0f}s", "infra")
    return NodePhase.FAILED


def _decide(node: NodeContext, gen: int, spec: TaskSpec, m: Membership, store: NodeStore,
            report: FailureReport | None) -> NodePhase:
    before = _beats(store)
    time.sleep(DECIDE_WINDOW_S)  # let the other nodes' reports of the same event arrive
    reports = _reports(store, report)
    silent = _silent(node, m, store, before)
    missing = _missing(node, m, silent)
    if missing and not any(r.lost for r in reports):  # its peers' errors followed its loss
        reports.append(_lost(m, missing, reports))
    root = _root_cause(m, reports)
    restartable = root.label == "infra" or spec.restart_on == "any"
    if (root.status == TaskStatus.TIMED_OUT.value or gen >= spec.max_restarts
            or not restartable or node.records.cancelled()):
        note = f" after {gen} restart(s)" if gen else ""
        if gen < spec.max_restarts and not restartable:
            note += (f" (not restarted: a {root.label} failure; max_restarts restarts after "
                     "infra failures, restart_on='any' after any)")
        node.records.write_outcome(Outcome(
            root.status, root.message + note, time.time(), node=root.node, rank=root.rank,
            exit_code=root.exit_code, signal_name=root.signal_name,
            log_tail=list(root.log_tail), has_error_payload=root.has_error_payload,
            label=root.label, consequences=consequences(root, reports)))
        return NodePhase.FAILED
    return _restart(node, gen, spec, m, root, silent)


def _beats(store: NodeStore) -> list[int] | None:
    try:
        return store.heartbeats()
    except StoreLost:
        return None


def _silent(node: NodeContext, m: Membership, store: NodeStore, before: list[int] | None
            ) -> set[int]:
    """Nodes (by rank) whose instance runs but whose agent did not heartbeat since the
    decision began, within SILENT_AFTER_S: their agent died (killed, crashed) while their
    machine is still up, so they would never join the next generation. A node whose
    instance stops meanwhile counts as lost anyway and is not waited for."""
    wait = Deadline.after(SILENT_AFTER_S)
    while before is not None:
        now = _beats(store)
        if now is None:
            return set()
        running = {i.instance_id for i in node.gang.instances() if i.state == "running"}
        quiet = {rank for rank, iid in enumerate(m.instance_ids) if rank != m.node_rank
                 and iid in running and now[rank] == before[rank]}
        if not quiet or wait.passed():
            return quiet
        time.sleep(WAITING_BEAT_S)
    return set()


def _missing(node: NodeContext, m: Membership, silent: set[int]) -> list[int]:
    """The other nodes (by rank) that are gone or whose agent fell silent."""
    running = {i.instance_id for i in node.gang.instances() if i.state == "running"}
    return sorted(r for r, iid in enumerate(m.instance_ids)
                  if r != m.node_rank and (iid not in running or r in silent))


def _lost(m: Membership, ranks: list[int], reports: list[FailureReport]) -> FailureReport:
    """A lost node's report, timed just before the failures it caused."""
    first = min((r.observed_at for r in reports), default=time.time())
    names = ", ".join(f"node {r} ({m.instance_ids[r]}, {m.addresses[r]})" for r in ranks)
    return FailureReport(node=ranks[0], status=TaskStatus.FAILED.value, lost=True,
                         message=f"{names} was lost: its instance stopped or its agent fell "
                                 "silent", observed_at=first - 0.001, label="infra")


def _reports(store: NodeStore, report: FailureReport | None) -> list[FailureReport]:
    """Every node's report (this node's own too, when the store is gone)."""
    try:
        reports = store.failure_reports()
    except StoreLost:
        reports = []
    if report is not None and report not in reports:
        reports.append(report)
    return reports


def _root_cause(m: Membership, reports: list[FailureReport]) -> FailureReport:
    """The earliest failure, by when it happened on the leader's clock (``root_cause``)."""
    if not reports:
        return FailureReport(node=m.node_rank, status=TaskStatus.FAILED.value,
                             observed_at=time.time(), label="sdk",
                             message="a node reported a failure but no report survived")
    return root_cause(reports)[0]


def _restart(node: NodeContext, gen: int, spec: TaskSpec, m: Membership,
             root: FailureReport, silent: set[int]) -> NodePhase:
    """Replaces the lost nodes (gone, or silent: see ``_silent``) and opens generation
    ``gen + 1``; FAILED when this node is one of those replaced, or when the provider
    refuses."""
    running = {i.instance_id for i in node.gang.instances() if i.state == "running"}
    lost = [iid for rank, iid in enumerate(m.instance_ids)
            if iid not in running or rank in silent or (root.lost and rank == root.node)]
    cause = root.message.splitlines()[0]
    node.log.event(f"generation {gen} failed ({cause}); restart {gen + 1} of "
                   f"{spec.max_restarts}" + (f", replacing {', '.join(lost)}" if lost else ""))
    others = [iid for iid in lost if iid != node.instance_id]
    try:
        if others:
            node.gang.release(others)
        node.records.write_restart(gen + 1, root, lost)
        taken = set(m.instance_ids) | node.records.replaced()
        added = node.gang.replace(spec, len(lost), taken) if lost else []
        kept = [GangMember(iid, address) for iid, address in zip(m.instance_ids, m.addresses)
                if iid not in lost]
        node.records.write_members(gen + 1, kept + added)
        if added:
            node.log.event(f"generation {gen + 1} takes {', '.join(a.instance_id for a in added)}"
                           f" in place of {', '.join(lost)}")
        if node.instance_id in lost:  # this node is the lost one (e.g. a spot interruption):
            node.log.event("this node is being replaced; terminating it")  # it goes last
            node.gang.release([node.instance_id])
            return NodePhase.FAILED
    except FlowError as exc:
        node.records.fail(f"could not restart after {cause}: {exc}", "infra")
        return NodePhase.FAILED
    return NodePhase.RESTARTING
