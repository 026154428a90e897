"""The one owner of a task's end: the only module that writes a task's outcome record, and
the one that judges how a task ended when no node said so.

The outcome is written once: the first valid record wins (the signed store's
``put_record_if_absent``), whoever reports it — a node agent (success, failure, timeout), the
client (a launch that failed or was interrupted, ``Task.cancel``, a task whose nodes all
vanished without a word, once ``Task.wait`` settles it) or ``flow gc`` (a task no client on
this machine knows any more). Reading a task's status never writes. ``flow gc`` also judges which
pools are leftovers: half-made ones (an interrupted ``pool up``) and ones past their idle stop
whose nodes did not stop; live pools are left alone. Providers reclaim what a
task left (``Provider.gc``), told which tasks this module judged ended; they never decide how
a task ended.

Whether a task has ended is answered here only, and only from what is sealed with the task's
secret (``ended``): an object a store writer put there without the secret never ends a task, a
pool or a launch. Where the secret is not at hand (``ended_here`` on a machine that did not
launch the task) the answer is "it may be live", and nothing of the task is reclaimed.

This module imports the wire layer (``flow_sdk.wire``), the client's task secrets and the providers'
interface only; the client (``task``, ``app``, ``cli``), the node agent, the pool daemon and the
node-side volume step call it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection

from flow_sdk import wire
from flow_sdk.home import poolfiles, tasksecrets
from flow_sdk.errors import RecordError, SignatureError
from flow_sdk.wire import LaunchLease, Outcome, TaskRecord, TaskStatus, runtimecap
from flow_sdk.providers.base import ObjectStore, Provider, SchedulerEnd
from flow_sdk.providers.gcreport import GcReport
from flow_sdk.providers.objects_gc import ObjectsReport, remove_finished_tasks
from flow_sdk.wire.pools import MemberRecord, PoolRecord, members_prefix, pool_key
from flow_sdk.wire.signing import SignedStore

PAST_IDLE_STOP_S = 120.0  # a pool node this long past its idle stop should have stopped

ORPHANED = "no client record on this machine (the task is recorded CANCELLED)"
ORPHANED_DRY_RUN = "no client record on this machine (the task would be recorded CANCELLED)"


# -- writing and reading the outcome --------------------------------------------------------

def record_outcome(store: SignedStore, task_id: str, outcome: Outcome) -> bool:
    """Write the task's outcome, signed, unless a valid one is there: whether this call
    wrote it. A slot that holds a forgery is passed over (``wire.outcome_key``): the slots
    have no end, so forgeries can slow the writer down but never keep it out."""
    slot = 0
    while not store.put_record_if_absent(key := wire.outcome_key(task_id, slot), outcome):
        if _valid_outcome(store, key) is not None:
            return False
        slot += 1
    return True


def outcome_of(store: SignedStore, task_id: str) -> Outcome | None:
    """The task's outcome: the first valid record over its slots (forged ones are passed
    over), or None while no one reported one (the first empty slot ends the search)."""
    slot = 0
    while (raw := store.raw.get(key := wire.outcome_key(task_id, slot))) is not None:
        outcome = _valid_outcome(store, key, raw)
        if outcome is not None:
            return outcome
        slot += 1
    return None


def _valid_outcome(store: SignedStore, key: str, raw: bytes | None = None) -> Outcome | None:
    """The outcome at ``key`` when it carries the task's MAC, else None (absent or forged).
    A signed record of an unknown shape raises ``RecordError``: a version mismatch."""
    try:
        raw = store.get_record(key) if raw is None else store.check_record(key, raw)
    except SignatureError:
        return None
    return Outcome.from_json(raw) if raw is not None else None


# -- has it ended: the one check ---------------------------------------------------------------

def ended(store: SignedStore, task_id: str) -> Outcome | None:
    """The one answer to "has this task ended?": its outcome when one is sealed with the
    task's secret (``store``), else None: it may be live. A forged or junk outcome is passed
    over; a sealed one of another version counts as "may be live" too (it cannot be read).
    Every check in the package that acts on a task's end goes through here."""
    try:
        return outcome_of(store, task_id)
    except RecordError:
        return None


def ended_here(store: ObjectStore, task_id: str) -> Outcome | None:
    """``ended`` through this machine's copy of the task's secret (``tasksecrets``: the tasks
    launched here); None, "it may be live", where this machine holds none."""
    if not task_id or not tasksecrets.has_task_secret(task_id):
        return None
    return ended(SignedStore(store, tasksecrets.load_task_secret(task_id)), task_id)


def launch_lease(store: SignedStore, task_id: str) -> LaunchLease | None:
    """The task's launch lease when it is sealed with the task's secret (the launching
    provider seals it), else None: an unsealed or junk lease says nothing. Once this machine's
    launch ended, its own note of how (``tasksecrets.launch_end``) gives the state: a store
    writer may put back an older sealed "launching" lease, never that note."""
    try:
        raw = store.get_record(wire.launch_lease_key(task_id))
        lease = None if raw is None else LaunchLease.from_json(raw)
    except (SignatureError, RecordError):
        lease = None
    end = tasksecrets.launch_end(task_id)
    if end is None or lease is not None and lease.state == end:
        return lease
    return LaunchLease(end, 0.0 if lease is None else lease.renewed_at,
                       0.0 if lease is None else lease.ttl_s, "this machine")


def _sealed_record(store: SignedStore, task_id: str) -> TaskRecord | None:
    try:
        raw = store.get_record(wire.task_key(task_id))
        return None if raw is None else TaskRecord.from_json(raw)
    except (SignatureError, RecordError):
        return None


def _past_cap(record: TaskRecord, now: float) -> bool:
    """Whether the task (by its sealed record) is past its runtime cap and gc's grace
    (``runtimecap.GC``)."""
    cap = record.spec.get("max_run_time_hours")
    if isinstance(cap, bool) or not isinstance(cap, (int, float)):
        return False
    deadline = runtimecap.GC.deadline(record.created_at, float(cap))
    return deadline is not None and now > deadline


# -- judgements: the outcome each way of ending gets ----------------------------------------

def cancelled_by_caller(now: float | None = None) -> Outcome:
    return Outcome(TaskStatus.CANCELLED.value, "cancelled by the caller",
                   time.time() if now is None else now)


def launch_ended(exc: BaseException, now: float | None = None) -> Outcome:
    """A launch that raised ``exc``: FAILED when the provider refused or broke, CANCELLED
    when it was interrupted (Ctrl-C, a signal: not an ``Exception``)."""
    now = time.time() if now is None else now
    interrupted = not isinstance(exc, Exception)
    status = TaskStatus.CANCELLED if interrupted else TaskStatus.FAILED
    return Outcome(status.value, f"launch {'interrupted' if interrupted else 'failed'}: "
                   f"{type(exc).__name__}: {exc}", now, label=None if interrupted else "infra")


def launch_refused(exc: BaseException, now: float | None = None) -> Outcome:
    """A launch the provider refused with a ``FlowError`` (its message says why)."""
    return Outcome(TaskStatus.FAILED.value, f"launch failed: {exc}",
                   time.time() if now is None else now, label="infra")


def nodes_vanished(agent_tail: list[str], boot_tail: list[str],
                   end: SchedulerEnd | None = None, now: float | None = None) -> Outcome:
    """Every node is gone and none wrote an outcome: FAILED (CANCELLED where someone
    cancelled the job outside the task), saying what ended them when the provider's scheduler
    knows (``end``), and where they died (the agents' last lines, else — no agent logged — the
    nodes' boot output)."""
    tail, what = agent_tail, "agent lines"
    message = ("every node exited without reporting an outcome (a node agent crashed or "
               "was killed)")
    if not tail:
        tail, what = boot_tail, "boot output"
        message = ("every node exited in boot, before its agent logged (install, image "
                   "pull, volumes or boot_timeout_s)")
    if end is not None:
        message = end.message
    if tail:
        message += f"; last {what}:\n  " + "\n  ".join(tail)
    status = TaskStatus.CANCELLED if end is not None and end.cancelled else TaskStatus.FAILED
    return Outcome(status.value, message, time.time() if now is None else now,
                   log_tail=tail, label="infra")


def cap_passed_unanswered(now: float | None = None) -> Outcome:
    """The task passed its runtime cap and the caller's grace (``runtimecap.CALLER``) with
    no node stopping it (its nodes stopped answering): TIMED_OUT, the caller stops it."""
    return Outcome(TaskStatus.TIMED_OUT.value, "the task passed its max_run_time_hours cap by "
                   f"{runtimecap.CALLER.grace_s:.0f} s and no node stopped it (its nodes stopped "
                   "answering); the caller stopped it", time.time() if now is None else now,
                   label="infra")


def never_started(waited_s: float, why: str, now: float | None = None) -> Outcome:
    """The nodes waited in a scheduler's queue for longer than ``availability_timeout_s`` and
    never started: FAILED, and the caller cancels the job."""
    return Outcome(TaskStatus.FAILED.value, f"the nodes never started: they waited "
                   f"{waited_s:.0f} s, longer than availability_timeout_s, and are still "
                   f"{why}; the job was cancelled. Raise availability_timeout_s to wait longer "
                   "(a busy shared cluster can queue a job for hours)",
                   time.time() if now is None else now, label="infra")


def launch_left(why: str, now: float | None = None) -> Outcome:
    """A launch whose client went away before saying how it ended (``flow gc`` judges it
    once nothing of it runs): CANCELLED, as an interrupted launch."""
    return Outcome(TaskStatus.CANCELLED.value, f"launch interrupted: {why}; `flow gc` "
                   "reclaimed what it started", time.time() if now is None else now)


def orphaned(now: float | None = None) -> Outcome:
    return Outcome(TaskStatus.CANCELLED.value, "stopped by `flow gc`: no client on this "
                   "machine knows the task", time.time() if now is None else now)


# -- gc: which tasks ended, then the provider reclaims ----------------------------------------

def signed_ends(provider: Provider, now: float | None = None
                ) -> tuple[dict[str, str], list[str]]:
    """The tasks this machine launched (it holds their secret) in ``provider``'s store that
    ended, with why their leftovers may go, and the ids of those with no sealed outcome. Only
    what is sealed with the task's secret counts: its outcome (``ended``), its launch lease
    (``unreported_end``) and its record's runtime cap; a forgery in the store never makes
    ``flow gc`` reclaim a running task (providers hold no secret and never judge an end)."""
    now = time.time() if now is None else now
    found: dict[str, str] = {}
    running: list[str] = []
    for task_id in tasksecrets.task_secret_ids():
        if not provider.store.exists(wire.task_key(task_id)):
            continue
        store = SignedStore(provider.store, tasksecrets.load_task_secret(task_id))
        outcome = ended(store, task_id)
        if outcome is not None:
            found[task_id] = f"task ended {outcome.status}"
            continue
        running.append(task_id)
        why = unreported_end(provider, store, task_id, now)
        if why is not None:
            found[task_id] = why
    return found, running


def unreported_end(provider: Provider, store: SignedStore, task_id: str, now: float
                   ) -> str | None:
    """Why a task with no outcome has ended all the same, from its sealed records and the
    provider's own view, else None: its launch was rolled back, or cut short (its launching
    client stopped renewing the lease), or its gang launched and no instance of it is up any
    more, or it is past its runtime cap and gc's grace (``runtimecap.GC``)."""
    lease = launch_lease(store, task_id)
    if lease is not None and lease.state == "rolled-back":
        return "its launch ended without a gang and was rolled back"
    if lease is not None and lease.state == "launching" and lease.stale(now):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lease.renewed_at))
        return (f"its launch was cut short: the launching client ({lease.holder}) last "
                f"renewed its launch lease at {when}")
    if lease is not None and lease.state == "launched" and not _up(provider, task_id):
        return "its gang launched and no instance of it is up any more"
    record = _sealed_record(store, task_id)
    if record is not None and _past_cap(record, now):
        return "task is past its max_run_time_hours and wrote no outcome"
    return None


def _up(provider: Provider, task_id: str) -> bool:
    return any(i.state != "terminated" for i in provider.list_instances(task_id))


def orphans(provider: Provider, known: Collection[str], running: Collection[str]
            ) -> list[str]:
    """Of ``running`` (``signed_ends``: tasks this machine launched, with no valid outcome),
    those that no client record names any more (``known``: the task ids that have one) and
    that still have a node up."""
    return [task_id for task_id in running if task_id not in known and _up(provider, task_id)]


def leftover_pools(provider: Provider, now: float | None = None) -> dict[str, str]:
    """Pools this machine made on ``provider`` (this configuration of it) that are leftovers,
    by pool id, with why: half-made (their ``pool up`` stopped before the nodes were ready, and
    it no longer runs) or past their idle stop while their nodes still run."""
    now = time.time() if now is None else now
    config = json.dumps(provider.config(), sort_keys=True)
    found = {}
    for pool in poolfiles.list_pool_files():
        if pool.provider != provider.name or json.dumps(pool.provider_config,
                                                        sort_keys=True) != config:
            continue
        if pool.launching or not any(i.state != "terminated"
                                     for i in provider.list_instances(pool.pool_id)):
            continue
        why = _pool_leftover(provider, pool, now)
        if why is not None:
            found[pool.pool_id] = why
    return found


def _pool_leftover(provider: Provider, pool: poolfiles.PoolFile, now: float) -> str | None:
    if not tasksecrets.has_task_secret(pool.pool_id):
        return f"pool {pool.name}: this machine lost its secret, so nothing can run on it"
    store = SignedStore(provider.store, tasksecrets.load_task_secret(pool.pool_id))
    try:
        raw = store.get_record(pool_key(pool.pool_id))
        record = None if raw is None else PoolRecord.from_json(raw)
        members = [MemberRecord.from_json(data) for key in
                   provider.store.list(members_prefix(pool.pool_id))
                   if (data := store.get_record(key)) is not None]
    except (SignatureError, RecordError) as exc:
        return f"pool {pool.name}: its records are not the pool's own ({exc})"
    if record is None or record.state == "starting":
        return (f"half-made pool {pool.name}: its `pool up` stopped before the nodes were "
                "ready")
    stops = [m.stop_at for m in members if m.state == "idle" and m.stop_at is not None]
    if members and len(stops) == len(members) and now > max(stops) + PAST_IDLE_STOP_S:
        return (f"pool {pool.name} is past its idle stop ({record.idle_stop_s:g}s) but its "
                "nodes still run")
    return None


def forget_pool(pool_id: str) -> None:
    """Remove this machine's file and secret of a pool that was reclaimed."""
    for pool in poolfiles.list_pool_files():
        if pool.pool_id == pool_id:
            poolfiles.remove_pool_file(pool.name, pool_id)
    tasksecrets.remove_task_secret(pool_id)


def collect(provider: Provider, known: Collection[str], *, dry_run: bool = False
            ) -> GcReport:
    """``flow gc`` for one provider: record CANCELLED for each orphaned task (``orphans``:
    signed with the task's secret, so its client can check it), then ask the provider to
    reclaim what ended tasks (``signed_ends``), orphans and leftover pools
    (``leftover_pools``) left, then record CANCELLED for each launch whose client left it
    (``_launch_left``). With ``dry_run`` nothing is recorded or reclaimed."""
    pools = leftover_pools(provider)
    doomed, running = signed_ends(provider)
    doomed.update(pools)
    for task_id in orphans(provider, known, running):
        if dry_run:
            doomed[task_id] = ORPHANED_DRY_RUN
            continue
        store = SignedStore(provider.store, tasksecrets.load_task_secret(task_id))
        if record_outcome(store, task_id, orphaned()):
            doomed[task_id] = ORPHANED
    report = provider.gc(dry_run=dry_run, ended=doomed)
    if not dry_run:
        for task_id in running:  # what the provider reclaimed of a launch its client left
            store = SignedStore(provider.store, tasksecrets.load_task_secret(task_id))
            why = _launch_left(provider, store, task_id)
            if why is not None:
                record_outcome(store, task_id, launch_left(why))
        for pool_id in pools:
            forget_pool(pool_id)
    return report


def _launch_left(provider: Provider, store: SignedStore, task_id: str,
                 now: float | None = None) -> str | None:
    """Why the task's launch ended without its client (killed mid-launch, or gone after a
    rollback) once none of its nodes is up, else None. Only a lease sealed with the task's
    secret counts, and only with every node gone: it never ends a running task."""
    lease = launch_lease(store, task_id)
    if lease is None or not (lease.state == "rolled-back" or lease.state == "launching"
                             and lease.stale(time.time() if now is None else now)):
        return None
    if _up(provider, task_id):
        return None
    if lease.state == "rolled-back":
        return "its launch was rolled back and its client never said how it ended"
    return (f"its launching client ({lease.holder}) stopped renewing its launch lease: it "
            "was killed mid-launch")


def remove_finished_objects(provider: Provider, older_than_s: float, *,
                            dry_run: bool = False) -> ObjectsReport:
    """``flow gc --older-than``: remove the stored objects of the tasks whose sealed outcome
    (``ended_here``) is older than ``older_than_s``; a task this machine cannot check (no
    secret here) may be live and keeps every object."""
    return remove_finished_tasks(provider.store, older_than_s,
                                 lambda task_id: ended_here(provider.store, task_id),
                                 dry_run=dry_run)
