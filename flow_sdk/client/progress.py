"""What the caller sees while a task starts and runs: the plan, each phase as it happens
(plan -> provisioning n/N nodes -> rendezvous n/N nodes joined -> running, then what the
workers do until the caller's code runs: starting, importing your code; with elapsed time)
and the workers' output, as Modal and SkyPilot show it.

On a terminal the phases are a ``rich`` status line; otherwise plain time-stamped lines. Phases
go to stderr, the workers' output to stdout. ``quiet`` shows nothing. Everything is read
through the ``Task`` handle's status, node and log APIs.
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TextIO

from rich.console import Console
from rich.prompt import Confirm
from rich.status import Status

from flow_sdk.catalog import CatalogError, load_catalog
from flow_sdk.errors import FieldProblem, LaunchDeclinedError, ValidationError
from flow_sdk.wire import NodePhase, TaskStatus
from flow_sdk.wire.records import WORKER_ACTIVITIES
from flow_sdk.providers.base import LaunchPlan
from flow_sdk.client.failure import HeldTracebacks
from flow_sdk.client.task import Task
from flow_sdk.client.taskstate import judge, waiting

StreamChoice = Literal["rank0", "all", "none"]
STREAM_CHOICES: tuple[StreamChoice, ...] = ("rank0", "all", "none")
_POLL_S = 0.2


@dataclass(frozen=True)
class WatchOptions:
    """How a launch talks to the caller. ``quiet``: show nothing. ``stream``: whose output to
    stream during ``.remote()`` (``"rank0"``, ``"all"`` ranks labelled, or ``"none"``).
    ``confirm``: on a terminal, ask before a launch that costs money."""

    quiet: bool = False
    stream: StreamChoice = "rank0"
    confirm: bool = True

    def __post_init__(self) -> None:
        for name in ("quiet", "confirm"):
            if not isinstance(getattr(self, name), bool):
                raise ValidationError([FieldProblem(name, (
                    f"must be True or False, not {getattr(self, name)!r}"))])
        if self.stream not in STREAM_CHOICES:
            raise ValidationError([FieldProblem("stream", (
                f"{self.stream!r} is not one of {', '.join(STREAM_CHOICES)}: 'rank0' streams "
                "rank 0's output, 'all' every rank's (labelled), 'none' nothing"))])


WATCH_OPTIONS = ("quiet", "stream", "confirm")


class _Ticking:
    """A status text whose elapsed time is computed each time the status line redraws."""

    def __init__(self, text: str, started: float) -> None:
        self.text = text
        self.started = started

    def __rich__(self) -> str:
        return f"{self.text} ({time.monotonic() - self.started:.1f}s)"


class Reporter:
    """Phases on ``err`` (stderr): a status line on a terminal, time-stamped lines when not."""

    def __init__(self, quiet: bool = False, err: TextIO | None = None) -> None:
        self.quiet = quiet
        self.err = err if err is not None else sys.stderr
        self.tty = self.err.isatty()
        self.console = Console(file=self.err, force_terminal=self.tty, highlight=False,
                               soft_wrap=True)
        self.started = time.monotonic()
        self._phase: str | None = None
        self._status: Status | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def note(self, text: str) -> None:
        """A line that stays (a finished phase, the plan, the outcome)."""
        if self.quiet:
            return
        if self.tty:
            self.console.print(f"[bold cyan]flow[/] {text}", markup=True, highlight=False)
        else:
            stamp = time.strftime("%H:%M:%S")
            print(f"{stamp} flow: {text}", file=self.err, flush=True)

    def phase(self, text: str) -> None:
        """The current phase: a new one is noted with its start time; on a terminal the
        status line below shows it with the time since the launch."""
        if self.quiet:
            return
        if text != self._phase:
            self._phase = text
            self.note(f"{text} [{self.elapsed():.1f}s]")
        if self.tty:
            line = _Ticking(text, self.started)
            if self._status is None:
                self._status = self.console.status(line)
                self._status.start()
            else:
                self._status.update(line)

    def shares_terminal(self, out: TextIO) -> bool:
        """True when ``out`` is the terminal the status line is drawn on: lines printed
        through the status line's console then stay above it."""
        if not self.tty or self.quiet:
            return False
        try:
            return os.path.samestat(os.fstat(out.fileno()), os.fstat(self.err.fileno()))
        except (OSError, ValueError, io.UnsupportedOperation):  # not a real file
            return False

    def print_above(self, line: str) -> None:
        """A worker's line, printed above the status line."""
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def stop(self) -> None:
        """End the status line (before the workers' output, or at the end)."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def confirm(self, question: str) -> bool:
        """Ask on the terminal (default no)."""
        self.stop()
        return Confirm.ask(question, console=self.console, default=False)


def describe_plan(plan: LaunchPlan) -> str:
    """One line: what a launch starts, where, how, at what price, and how old the prices are."""
    if plan.cost_per_hour <= 0:
        return (f"plan: {plan.nodes} node(s), {plan.instance_type} on {plan.provider}; "
                "costs nothing")
    where = plan.region + (f" ({plan.zone})" if plan.zone else "")
    cap = (f"${plan.cost_at_cap:,.2f} at the {plan.max_run_time_hours:g} h runtime cap"
           if plan.cost_at_cap is not None else "no runtime cap: it bills until it ends")
    return (f"plan: {plan.nodes} x {plan.instance_type} in {where}, {plan.market}, "
            f"${plan.usd_per_hour:,.2f}/h per node = ${plan.cost_per_hour:,.2f}/h; {cap}; "
            f"prices from {plan.price_source or 'the catalog of ' + _catalog_date()}")


def _catalog_date() -> str:
    try:
        return load_catalog().as_of.isoformat()
    except CatalogError as exc:
        return f"unknown date ({exc})"


def show_plan(plan: LaunchPlan, reporter: Reporter, options: WatchOptions,
              stdin: TextIO | None = None, notes: Sequence[str] = ()) -> None:
    """Show the plan and the provider's ``notes`` (the options it runs without); for a
    launch that costs money, ask on a terminal unless ``options.confirm`` is off. Raises
    ``LaunchDeclinedError`` when the caller says no."""
    reporter.note(describe_plan(plan))
    for note in notes:
        reporter.note(f"note: {note}")
    asking = options.confirm and plan.cost_per_hour > 0
    if asking and (stdin if stdin is not None else sys.stdin).isatty() and reporter.tty:
        if not reporter.confirm(f"Launch {plan.nodes} node(s) at "
                                f"${plan.cost_per_hour:,.2f}/h?"):
            raise LaunchDeclinedError("launch declined; nothing was started (skip the "
                                      "question with --yes, or confirm=False in Python)")


def watch(task: Task, reporter: Reporter, stream: StreamChoice,
          out: TextIO | None = None) -> TaskStatus:
    """Show the task's phases until it runs, then stream the chosen workers' output (with
    the task's events as ``[flow]`` lines) until it ends; returns its terminal state and
    tears the nodes down."""
    target = out if out is not None else sys.stdout
    status = wait_running(task, reporter)
    above = reporter.shares_terminal(target)
    if not above:
        reporter.stop()
    held = HeldTracebacks()  # a failure is reported once, by the error the caller gets
    if stream != "none":  # a task that ended already: its lines so far, then it stops
        rank = 0 if stream == "rank0" else None
        for entry in task.log_entries(follow=True, rank=rank):
            for line in held.feed(entry):
                if above:
                    reporter.print_above(line)
                else:
                    print(line, file=target, flush=True)
    status = task.wait()
    reporter.stop()
    for line in held.end(failed=status is TaskStatus.FAILED):
        print(line, file=target, flush=True)
    reporter.note(f"task {task.task_id} {status} [{reporter.elapsed():.1f}s]")
    return status


def wait_running(task: Task, reporter: Reporter) -> TaskStatus:
    """Poll the phases (provisioning n/N nodes, with the reason a scheduler's queue gives,
    rendezvous n/N) until the task runs or ends;
    once it runs, what its workers do until they run the caller's code (``wait_workers``)."""
    expected = int(task.record().spec.get("num_instances", 1))
    status, _, instances = judge(task)
    while status in (TaskStatus.PENDING, TaskStatus.PROVISIONING):
        joined = len(task.nodes())
        if joined:
            reporter.phase(f"rendezvous: {joined}/{expected} nodes joined")
        else:
            up = sum(i.state == "running" for i in instances)
            why = waiting(instances)  # a scheduler's queue: the reason it gives
            reporter.phase(f"provisioning: {up}/{expected} nodes up"
                           + (f"; {why}" if why else ""))
        time.sleep(_POLL_S)
        status, _, instances = judge(task)
    joined = len(task.nodes())
    if status is TaskStatus.RUNNING or joined:  # a short task may end between two polls
        # the nodes passed the start barrier together: each one's record is there, though
        # the last may have joined between two polls
        reporter.phase(f"rendezvous: {joined}/{expected} nodes joined")
        reporter.phase(f"running on {expected} node(s)")
    if status is TaskStatus.RUNNING:
        wait_workers(task, reporter, expected)
    return status


def wait_workers(task: Task, reporter: Reporter, expected: int) -> None:
    """While the task runs and its workers have not all reached the caller's code, what the
    least advanced node's workers are doing (``NodeRecord.activity``: starting, importing
    your code); returns when they all run it, when no node is running any more, or when a
    node does not say (an older agent)."""
    first, last = WORKER_ACTIVITIES[0], WORKER_ACTIVITIES[-1]
    while task.status is TaskStatus.RUNNING:
        running = [n for n in task.nodes() if n.phase is NodePhase.RUNNING]
        if not running or any(n.activity not in WORKER_ACTIVITIES for n in running):
            return
        # a node past the start barrier whose record does not say so yet: its workers start
        pending = max(expected - len(running), 0)
        least = first if pending else min((n.activity for n in running),
                                          key=WORKER_ACTIVITIES.index)
        behind = pending + sum(n.activity == least for n in running)
        reporter.phase(f"running on {expected} node(s): workers {least}"
                       + ("" if least == last else f" ({behind}/{expected} node(s))"))
        if least == last:
            return
        time.sleep(_POLL_S)


def split_watch_options(options: dict[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """(the task spec's options, the caller-side ones: ``quiet``, ``stream``, ``confirm``)."""
    spec = {k: v for k, v in options.items() if k not in WATCH_OPTIONS}
    caller = {k: v for k, v in options.items() if k in WATCH_OPTIONS}
    return spec, caller
