"""``flow run``: launch a script on every worker of every node, show its phases, stream its
output, and exit with one code: the task's, or the script's own ``sys.exit`` code."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import click

from flow_sdk.client.app import FlowApp
from flow_sdk.cli._exits import EXIT_SIGNAL_BASE, exit_code
from flow_sdk.cli._failure import script_failure
from flow_sdk.client.failure import HeldTracebacks
from flow_sdk.cli._main import main
from flow_sdk.cli._options import (
    backend,
    provider_config_of,
    refuse,
    spec_kwargs,
    spec_options,
)
from flow_sdk.cli._output import emit_json
from flow_sdk.client.progress import Reporter, WatchOptions, show_plan, wait_running
from flow_sdk.wire import TaskStatus
from flow_sdk.client.script_imports import local_module_files
from flow_sdk.spec import build_task_spec
from flow_sdk.client.task import Task
from flow_sdk.client.tasklogs import LOG_SOURCES


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: handled like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _signals(detach: bool) -> Iterator[list[int]]:
    """SIGTERM and SIGHUP raise ``Stopped`` (so the task is cancelled like on Ctrl-C); with
    ``detach`` they are noted in the yielded list instead, and the launch completes."""
    seen: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        if detach:
            seen.append(signum)
            return
        raise Stopped(signum)

    saved = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield seen
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


def _script_path(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """PATH, which exists; an option ``flow run`` lacks lands here (options after PATH are the
    script's), so a PATH that looks like an option is reported as one."""
    text = str(value)
    if text.startswith("-") and not value.exists():
        flags = [opt for p in ctx.command.params for opt in p.opts if opt.startswith("--")]
        raise click.NoSuchOption(text.partition("=")[0], possibilities=flags, ctx=ctx)
    if not value.exists():
        raise click.BadParameter(f"{text!r} does not exist; give a script or a directory",
                                 ctx=ctx, param=param)
    return value


@main.command(context_settings={"ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@spec_options
@click.option("--entrypoint", help="For a directory: the script inside it (default main.py).")
@click.option("--app", "app_name", default="flow-run", show_default=True,
              help="App name recorded with the task.")
@click.option("-d", "--detach", is_flag=True, help="Print the task id and return at once.")
@click.option("--source", type=click.Choice(LOG_SOURCES), default="workers", show_default=True,
              help="Which logs to stream while waiting.")
@click.option("-y", "--yes", is_flag=True, help="Launch a plan that costs money without asking.")
@click.option("-q", "--quiet", is_flag=True, help="Show no phases (logs and the outcome only).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON on stdout "
              "(logs go to stderr).")
@click.argument("path", type=click.Path(path_type=Path), callback=_script_path)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(path: Path, args: tuple[str, ...], entrypoint: str | None, app_name: str, detach: bool,
        source: str, yes: bool, quiet: bool, as_json: bool, provider: str,
        provider_config: str | None, **spec: Any) -> None:
    """Run a script (or a directory's entry point) on every worker of every node (the
    default; --run-on head runs it on node 0 only), stream its logs, and exit with the
    task's code. Options go before PATH; everything after PATH is
    passed to the script. A script's own modules beside it travel with it.

    \b
        flow run -N 2 --workers-per-node 2 train.py --epochs 3
        flow run --gpu h100:8 -N 4 --provider aws --max-run-time-hours 12 train.py
        flow run --entrypoint src/main.py ./project --lr 0.1
    """
    if not path.is_dir() and entrypoint is not None:
        raise click.UsageError("--entrypoint is for directories; PATH is a file")
    options = spec_kwargs(spec)
    config = provider_config_of(provider_config)
    chosen = backend(provider, config)
    reporter = Reporter(quiet)
    name = Path(entrypoint or "main.py").stem if path.is_dir() else path.stem
    if not path.is_dir():
        local_module_files(path)  # an import it cannot follow stops here, before the plan
    task_spec = build_task_spec(app=app_name, name=name, provider=provider, **options)
    refuse(chosen.problems(task_spec) + chosen.launch_problems(task_spec), config)
    plan = chosen.plan(task_spec)
    show_plan(plan, reporter, WatchOptions(quiet=quiet, confirm=not yes),
              notes=chosen.notes(task_spec))
    app = FlowApp(app_name, provider=provider, provider_config=config)
    task: Task | None = None
    try:
        with _signals(detach) as seen:
            if path.is_dir():
                task = app.submit_directory(path, entrypoint=entrypoint or "main.py",
                                            args=args, **options)
            else:
                task = app.submit_file(path, args=args, **options)
            if detach:
                _detached(task, seen, as_json)
                return
            reporter.note(f"task {task.task_id} started ({provider}); `flow logs "
                          f"{task.task_id}`, `flow cancel {task.task_id}`")
            status = _watch(task, reporter, source, logs_to_stderr=as_json)
    except KeyboardInterrupt as exc:
        reporter.stop()
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        what = signal.Signals(signum).name if isinstance(exc, Stopped) else "interrupted"
        if task is not None:
            task.cancel()
            click.echo(f"\nflow: {what}: task {task.task_id} cancelled", err=True)
        else:
            click.echo(f"\nflow: {what} before the launch completed", err=True)
        sys.exit(EXIT_SIGNAL_BASE + signum)
    where = (path.resolve() if path.is_dir() else path.resolve().parent)
    entry = (entrypoint or "main.py") if path.is_dir() else path.name
    sys.exit(_report(task, status, reporter, entry, where, as_json))


def _detached(task: Task, seen: list[int], as_json: bool) -> None:
    if as_json:
        emit_json({"task_id": task.task_id, "status": str(task.status)})
    else:
        click.echo(task.task_id)
    if seen:
        name = signal.Signals(seen[0]).name
        click.echo(f"flow: {name}: task {task.task_id} left running (--detach); `flow cancel "
                   f"{task.task_id}` stops it", err=True)
        sys.exit(EXIT_SIGNAL_BASE + seen[0])


def _watch(task: Task, reporter: Reporter, source: str, logs_to_stderr: bool) -> TaskStatus:
    """Phases until the task runs, then its logs until it ends (each worker's traceback held
    back: a failure is reported once, by ``_report``); tears the nodes down."""
    status = wait_running(task, reporter)
    above = not logs_to_stderr and reporter.shares_terminal(sys.stdout)
    if not above:  # the status line stays only where the logs can print above it
        reporter.stop()
    held = HeldTracebacks()
    # a task that ended already (a short one, between two polls): its lines, then it stops
    for entry in task.log_entries(follow=True, source=source):  # type: ignore[arg-type]
        for line in held.feed(entry):
            if above:
                reporter.print_above(line)
            else:
                click.echo(line, err=logs_to_stderr)
    status = task.wait()
    reporter.stop()
    for line in held.end(failed=status is TaskStatus.FAILED):
        click.echo(line, err=logs_to_stderr)
    return status


def _report(task: Task, status: TaskStatus, reporter: Reporter, entrypoint: str,
            local_root: Path, as_json: bool) -> int:
    """Say how the task ended, once; returns the exit code (the script's own, when it
    failed by itself)."""
    outcome = task.outcome()
    elapsed = reporter.elapsed()
    code = exit_code(status)
    lines: list[str] = []
    reason = own_reason = outcome.message if outcome is not None else ""
    if status is TaskStatus.FAILED:
        lines, own_reason, own_code = script_failure(task.error(), entrypoint, local_root)
        if own_code is not None:
            code, reason = own_code, ("the script raised the error above" if lines
                                      else own_reason)
            if outcome is not None and outcome.node is not None:
                reason += f" (node {outcome.node}, rank {outcome.rank})"
    if as_json:
        emit_json({"task_id": task.task_id, "status": str(status),
                   "message": (own_reason if lines else reason) or None,
                   "node": outcome.node if outcome else None,
                   "rank": outcome.rank if outcome else None,
                   "traceback": lines or None,
                   "exit_code": code, "elapsed_s": round(elapsed, 3)})
        return code
    for line in lines:
        click.echo(line, err=True)
    line = f"flow: task {task.task_id} {status} after {elapsed:.1f}s"
    if status is not TaskStatus.SUCCEEDED and reason:
        line += f": {reason}"
    click.echo(line, err=True)
    return code
