"""Diagnosis commands: ``flow timeline TASK`` (when each node of a task reached each step of
its launch and run) and ``flow stacks TASK`` (every worker's Python stacks while it runs, the
last ones taken once it ended)."""

from __future__ import annotations

import dataclasses

import click

from flow_sdk.cli._main import main
from flow_sdk.cli._options import find_task
from flow_sdk.cli._output import emit_json
from flow_sdk.client.stacks import task_stacks
from flow_sdk.client.timeline import render, task_timeline


@main.command()
@click.argument("task_ref", metavar="TASK")
@click.option("--width", type=click.IntRange(10, 400), default=60, show_default=True,
              help="Characters of each node's bar.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: each node's phases (epoch seconds) and the per-phase seconds.")
def timeline(task_ref: str, width: int, as_json: bool) -> None:
    """Show when each node was requested, running, booted, up, joined, released and done:
    one bar per node and the seconds each phase took."""
    found = task_timeline(find_task(task_ref))
    if as_json:
        emit_json(found.as_dict())
    else:
        click.echo(render(found, width=width))


@main.command()
@click.argument("task_ref", metavar="TASK")
@click.option("--node", type=int, help="Only this node's workers.")
@click.option("--timeout", type=float, default=20.0, show_default=True,
              help="Seconds to wait for the nodes' answers.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: each rank's stacks.")
def stacks(task_ref: str, node: int | None, timeout: float, as_json: bool) -> None:
    """Show every worker's Python stacks (all threads), read as tracebacks are, marking the
    ranks whose stacks stand apart from the rest (a rank outside the collective the others
    wait in). Of an ended task: the last stacks taken while it ran (a stall's)."""
    found = task_stacks(find_task(task_ref), node, timeout)
    if as_json:
        emit_json({"task_id": found.task_id, "odd_ranks": found.odd_ranks,
                   "missing": found.missing, "kept": found.kept or None,
                   "ranks": [dataclasses.asdict(d) for d in found.dumps]})
    else:
        click.echo(str(found))
