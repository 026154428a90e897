"""What this node's workers did wrong, as failure reports: when each failure happened (on the
leader's clock), whose fault it was (``user``, ``infra`` or ``sdk``) and one line saying what.

A worker that raised wrote its error file and, beside it, the facts the agent reads without
unpickling anything: the time it caught the exception, its label and a summary. A worker that
died without a word (a signal, ``os._exit``) is timed at the last poll that saw it alive: it
died after that, and a peer that failed because of it failed later still. A SIGKILL the
kernel's OOM killer sent reads as out of memory; a signal from outside is ``infra``; a crash
signal (SIGSEGV, SIGABRT, ...) is the worker's own, ``user``.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import replace
from pathlib import Path

from flow_sdk.system import procs
from flow_sdk.node.agent.oom import KernelLog
from flow_sdk.node.agent.stall import RankProgress
from flow_sdk.node.agent.worker import failure_facts_path
from flow_sdk.node.agent.workers import WorkerExit, WorkerGroup
from flow_sdk.node.rendezvous.store import FailureReport, NodeStore, StoreLost
from flow_sdk.wire import TaskStatus

_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}
TAIL_IN_MESSAGE = 10
BEAT_S = 0.25  # how often a node heartbeats while it stops its workers
# What a node reports when the runtime cap stops it (``watch``); a consequence never names it
# when the task timed out: every node's cap is the same event as the root cause's.
CAP_MESSAGE = "the task reached its max_run_time_hours cap and was stopped on the nodes"


def _facts(error_file: Path) -> dict[str, object] | None:
    """The failure facts beside ``error_file``, or None (absent, or not what a worker
    writes)."""
    try:
        data = json.loads(failure_facts_path(error_file).read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(data, dict) and isinstance(data.get("failed_at"), (int, float))
            and data.get("label") in ("user", "infra", "sdk")
            and isinstance(data.get("summary"), str)):
        return None
    return data


def _signal_verdict(exit_: WorkerExit, kernel: KernelLog) -> tuple[str, str]:
    """(label, what happened) for a worker a signal ended."""
    name = exit_.signal_name or "a signal"
    if -exit_.returncode == signal.SIGKILL and kernel.oom_killed(exit_.pid, wait_s=0.5):
        return "infra", "was killed by the kernel's OOM killer (out of memory, SIGKILL)"
    if -exit_.returncode in _CRASH_SIGNALS:
        return "user", f"crashed ({name})"
    return "infra", f"was killed by {name} (a signal from outside the worker)"


def worker_failure(exit_: WorkerExit, workers: WorkerGroup, node: int, offset: float,
                   kernel: KernelLog) -> FailureReport:
    """The report of one failed worker; ``offset`` turns this node's clock into the
    leader's."""
    error_file = workers.error_path(exit_.rank)
    facts = _facts(error_file)
    where = f"node {node} rank {exit_.rank}"
    if facts is not None:
        label, what = str(facts["label"]), f"worker raised {facts['summary']}"
        at = float(facts["failed_at"])  # type: ignore[arg-type]
    elif exit_.returncode < 0:
        (label, what), at = _signal_verdict(exit_, kernel), exit_.alive_at
    else:
        label, what, at = "user", f"worker exited with code {exit_.returncode}", exit_.alive_at
    tail = workers.tail(exit_.rank)
    message = f"{where}: {what}"
    if tail:
        message += "; last lines:\n  " + "\n  ".join(tail[-TAIL_IN_MESSAGE:])
    return FailureReport(node=node, status=TaskStatus.FAILED.value, message=message,
                         observed_at=at + offset, rank=exit_.rank,
                         exit_code=exit_.returncode if exit_.returncode > 0 else None,
                         signal_name=exit_.signal_name, log_tail=tuple(tail),
                         has_error_payload=error_file.exists(), label=label)


def node_failures(workers: WorkerGroup, node: int, offset: float, kernel: KernelLog
                  ) -> list[FailureReport]:
    """Every worker of this node that failed on its own (not one the agent stopped), the
    earliest first."""
    stopped = workers.stopped_at if workers.stopped_at is not None else float("inf")
    reports = []
    for exit_ in workers.failed():
        facts = _facts(workers.error_path(exit_.rank))
        own = (float(facts["failed_at"]) <= stopped if facts is not None  # type: ignore[arg-type]
               else exit_.observed_at <= stopped)
        if own:
            reports.append(worker_failure(exit_, workers, node, offset, kernel))
    return sorted(reports, key=FailureReport.root_cause_key)


def root_cause(reports: list[FailureReport]) -> tuple[FailureReport, list[FailureReport]]:
    """(the root cause, the reports it stands for) of a non-empty list: the earliest report;
    but when the runtime cap is among them, the task timed out, and the cap's report tells
    what had gone wrong before it (a stalled or stopped rank: nothing else outlives the
    generation it broke) and names that rank."""
    ordered = sorted(reports, key=FailureReport.root_cause_key)
    first = ordered[0]
    cap = next((r for r in ordered if r.status == TaskStatus.TIMED_OUT.value), None)
    if cap is None or not _alive_but_silent(first):
        return first, [first]
    rest = first.message.split("\n", 1)[1:]  # its stack, where it has one
    told = replace(cap, message="\n".join([f"{cap.message}; before it, {first.summary()}",
                                           *rest]),
                   node=first.node, rank=first.rank, observed_at=first.observed_at,
                   others=first.others + cap.others)
    return told, [first, cap]


def _alive_but_silent(report: FailureReport) -> bool:
    """Whether ``report`` is of a rank that was alive when its generation ended (stalled, or
    stopped by SIGSTOP): it ended nothing by itself, the cap or its peers did."""
    return (report.status == TaskStatus.FAILED.value and report.rank is not None
            and not report.lost and report.exit_code is None and not report.has_error_payload
            and report.signal_name in (None, "SIGSTOP"))


def first_with_others(reports: list[FailureReport]) -> FailureReport | None:
    """The root cause (``root_cause``), carrying the other reports as its ``others``."""
    if not reports:
        return None
    root, merged = root_cause(reports)
    later = [r for r in sorted(reports, key=FailureReport.root_cause_key)
             if not any(r is m for m in merged)]
    return replace(root, others=root.others + tuple((r.summary(), r.observed_at)
                                                    for r in later))


def consequences(root: FailureReport, reports: list[FailureReport]) -> list[str]:
    """Every failure but the root cause, in time order, each with its delay after it: not
    the root cause's rank again (several nodes may report one stall), nor, when the task
    timed out, the other nodes' runtime caps."""
    seen: list[tuple[str, float]] = []
    for report in reports:
        same_rank = report.rank is not None and (report.node, report.rank) == (root.node,
                                                                              root.rank)
        other_cap = (root.status == report.status == TaskStatus.TIMED_OUT.value
                     and report.rank is None)
        if report != root and not same_rank and not other_cap:
            seen.append((report.summary(), report.observed_at))
        timed_out = root.status == TaskStatus.TIMED_OUT.value
        seen.extend(other for other in report.others  # a node's own cap came after its root
                    if not (timed_out and CAP_MESSAGE in other[0]))
    seen.sort(key=lambda item: item[1])
    return [f"{text} (+{at - root.observed_at:.3f}s)" for text, at in seen]


def stopped_workers(workers: WorkerGroup, node: int, progress: RankProgress
                    ) -> list[FailureReport]:
    """Workers that are alive but stopped (SIGSTOP, a debugger): a collective they block
    times out in their peers, who fail after them. Each is timed at its last progress."""
    found = []
    last = progress.last_progress()
    for w in workers.workers:
        if w.proc.poll() is None and procs.process_state(w.proc.pid) == "T":
            found.append(FailureReport(
                node=node, status=TaskStatus.FAILED.value, observed_at=last.get(w.rank, 0.0),
                message=f"node {node} rank {w.rank}: worker was stopped (SIGSTOP or a "
                        "debugger): alive but silent, it blocked its peers' collectives",
                rank=w.rank, signal_name="SIGSTOP", label="infra"))
    return found


class Keepalive:
    """The node's heartbeat while it stops its workers; once the store is gone, no more."""

    def __init__(self, store: NodeStore) -> None:
        self.store, self.next, self.gone = store, 0.0, False

    def beat(self) -> None:
        if self.gone or time.monotonic() < self.next:
            return
        self.next = time.monotonic() + BEAT_S
        try:
            self.store.heartbeat()
        except (StoreLost, OSError):
            self.gone = True  # the leader is gone: the decider knows without this node
