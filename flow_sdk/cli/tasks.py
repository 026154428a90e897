"""Commands about tasks this machine started: status, list, logs, ssh, cancel, doctor."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any

import click

from flow_sdk.cli._exits import EXIT_OK, EXIT_FAILED, exit_code
from flow_sdk.cli._main import main
from flow_sdk.cli._options import find_task, since_time
from flow_sdk.cli._output import ago, emit_json, pairs, table, when
from flow_sdk.wire import TaskStatus
from flow_sdk.client.overview import status_data, task_rows
from flow_sdk.client.tasklogs import LOG_SOURCES, shown_lines


@main.command()
@click.argument("task_ref", metavar="[TASK]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(task_ref: str | None, as_json: bool) -> None:
    """Show a task's state, nodes and outcome (default: the newest task)."""
    task = find_task(task_ref)
    data = status_data(task)
    if as_json:
        emit_json(data)
    else:
        rows: list[tuple[str, object]] = [
            ("task", data["task_id"]), ("name", f"{data['app']}/{data['name']}"),
            ("provider", data["provider"]), ("status", data["status"]),
            *([("waiting", data["waiting"])] if data["waiting"] else []),
            ("created", when(data["created_at"])),
            ("nodes", f"{len(data['nodes'])} of {data['num_instances']} joined")]
        outcome = data["outcome"]
        if outcome is not None:
            rows.append(("outcome", shown_lines(outcome["message"])))  # it holds a log tail
            if outcome.get("label"):
                rows.append(("failure", f"{outcome['label']} (user: an exception in your code; "
                                        "infra: node, memory, disk or a signal; sdk: flow-sdk)"))
            rows.extend(("then", line) for line in outcome.get("consequences", [])[:10])
        rows.extend(("stalled", stall) for stall in data["stalls"])
        click.echo(pairs(rows))
        if data["nodes"]:
            click.echo("")
            click.echo(table(["NODE", "INSTANCE", "ADDRESS", "PHASE", "WORKERS", "STATE", "SSH"],
                             [[n["node"], n["instance_id"], n["address"], n["phase"],
                               n["workers"], n["state"], n["ssh"] or "-"]
                              for n in data["nodes"]]))
    sys.exit(exit_code(TaskStatus(data["status"])))


@main.command(name="list")
@click.option("-n", "--limit", type=int, default=20, show_default=True,
              help="Show the newest N tasks (0: all).")
@click.option("--provider", help="Only the tasks of this provider, e.g. aws-sim.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the rows as one JSON array of objects, newest first.")
def list_tasks(limit: int, provider: str | None, as_json: bool) -> None:
    """List the tasks this machine started, newest first."""
    rows = [dataclasses.asdict(row) for row in task_rows(limit, provider)]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("no tasks yet; start one with `flow run FILE.py`")
        return
    now = time.time()
    click.echo(table(["TASK", "NAME", "PROVIDER", "STATUS", "NODES", "CREATED"],
                     [[r["task_id"], r["name"], r["provider"], _status_cell(r), r["nodes"],
                       ago(r["created_at"], now) if r["created_at"] else "-"]
                      for r in rows]))


def _status_cell(row: dict[str, Any]) -> str:
    """The status (with why its nodes wait in a scheduler's queue), or the one last seen
    when the provider cannot answer now, saying so."""
    if row["last_known"] is None:
        return str(row["status"]) + (f" ({row['waiting']})" if row["waiting"] else "")
    return f"{row['status']} (last seen; {row['last_known']})"


@main.command()
@click.argument("task_ref", metavar="TASK")
@click.option("--node", type=int, help="Only this node's lines.")
@click.option("--rank", type=int, help="Only this worker's lines (its global rank).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the task ends.")
@click.option("--tail", type=int, help="Only the last N lines (then follow, with -f).")
@click.option("--since", help="Only lines from this long ago (10m, 2h) or this epoch time.")
@click.option("--source", type=click.Choice(LOG_SOURCES), default="workers", show_default=True,
              help="workers: what user code printed, with the task's events as [flow] lines; "
                   "agent: the node agents; boot: each node's raw boot output; all: "
                   "everything.")
@click.option("--color", is_flag=True,
              help="Keep the colours and styles the task printed (ESC [...m sequences); "
                   "without it they are shown escaped, like every other control character.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per line: ts, node, rank, kind, text, line.")
def logs(task_ref: str, node: int | None, rank: int | None, follow: bool, tail: int | None,
         since: str | None, source: str, color: bool, as_json: bool) -> None:
    """Print a task's logs, merged in time order: `[Node i] [HH:MM:SS] text`, with
    `[rank r]` after the time when a node runs several workers, and `[flow]` for the task's
    events (a lost node, a restart, its replacements, the generation).

    Each carriage return a task prints (a progress bar's update) ends a line. Control
    characters and escape sequences show as text (ESC as \\x1b), so no line can move the
    cursor, rewrite its `[Node i]` label, set the terminal's title or hold a link."""
    task = find_task(task_ref)
    for entry in task.log_entries(node=node, tail=tail, follow=follow,  # type: ignore[arg-type]
                                  since=since_time(since), source=source, rank=rank,
                                  color=color):
        # color=True: click would strip the kept colours when the output is not a terminal
        click.echo(json.dumps(entry, sort_keys=True) if as_json else entry["line"],
                   color=color or None)
    if follow:
        task.wait()  # the task ended: tear down what is left of its nodes


@main.command()
@click.argument("task_ref", metavar="TASK")
@click.option("--node", type=int, default=0, show_default=True)
@click.option("-c", "--command", help="Run this command and exit with its code; without it, "
              "an interactive shell.")
@click.option("--timeout", type=float, help="Seconds the command may run.")
@click.option("--json", "as_json", is_flag=True,
              help="With --command: print node, exit_code, stdout and stderr as JSON.")
def ssh(task_ref: str, node: int, command: str | None, timeout: float | None,
        as_json: bool) -> None:
    """Open a shell on a node, or run a command there (host key pinned at launch)."""
    task = find_task(task_ref)
    if command is None:
        if as_json:
            raise click.UsageError("--json needs --command (an interactive shell prints no "
                                   "result)")
        sys.exit(task.ssh(node=node))
    result = task.ssh(node=node, command=command, timeout=timeout)
    if as_json:
        emit_json({"task_id": task.task_id, "node": node, "exit_code": result.exit_code,
                   "stdout": result.stdout, "stderr": result.stderr})
    else:
        click.echo(result.stdout, nl=False)
        click.echo(result.stderr, nl=False, err=True)
    sys.exit(result.exit_code)


@main.command()
@click.argument("task_ref", metavar="TASK")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def cancel(task_ref: str, as_json: bool) -> None:
    """Stop every worker on every node and tear the nodes down."""
    task = find_task(task_ref)
    before = task.status
    if not before.is_terminal:
        task.cancel()
    else:
        task.wait()  # already over: make sure nothing of it is left running
    after = task.status
    if as_json:
        emit_json({"task_id": task.task_id, "status": str(after),
                   "cancelled": not before.is_terminal})
    elif before.is_terminal:
        click.echo(f"task {task.task_id} had already ended: {after}")
    else:
        click.echo(f"task {task.task_id} {after}")


# -- doctor -------------------------------------------------------------------------------------


@main.command()
@click.argument("task_ref", metavar="TASK")
@click.option("--timeout", type=float, default=3.0, show_default=True,
              help="Seconds each connection attempt may take.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def doctor(task_ref: str, timeout: float, as_json: bool) -> None:
    """Check that every node of a running task reaches every other node (their SSH ports) and
    the leader's rendezvous port. Exits 1 when a pair cannot talk."""
    from flow_sdk.client.doctor import check_task

    checks = check_task(find_task(task_ref), timeout_s=timeout)
    if as_json:
        emit_json([{**dataclasses.asdict(c), "ok": c.ok} for c in checks])
    else:
        for check in checks:
            if check.ok:
                click.echo(f"node {check.node} ({check.address}): reaches every peer")
            elif check.error is not None:
                click.echo(f"node {check.node} ({check.address}): {check.error}")
            else:
                for line in check.failures:
                    click.echo(f"node {check.node} ({check.address}) cannot reach {line}")
    sys.exit(EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED)
