"""``flow pool``: pools of warm nodes that outlive a task: up, list, down.

    flow pool up dev --gpu h100:8 -N 4 --spares 1 --idle-stop 30m
    flow run --pool dev train.py        # runs on the pool's warm nodes
    flow pool list; flow pool down dev
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import click

from flow_sdk.cli._main import main
from flow_sdk.cli._options import _volumes, as_passed, provider_config_of
from flow_sdk.cli._output import emit_json, table
from flow_sdk.client.overview import pool_row
from flow_sdk.client.pools import Pool, PoolStatus, list_pools, pool_up
from flow_sdk.errors import ValidationError


@main.group(name="pool")
def pool_group() -> None:
    """Pools of warm nodes: tasks with --pool NAME run on them with no boot."""


@pool_group.command(name="up")
@click.argument("name")
@click.option("--gpu", help="GPUs per node, e.g. h100:8 (default: CPU).")
@click.option("-N", "--num-instances", "--nodes", type=int, default=1, show_default=True,
              help="Nodes a task may use.")
@click.option("--spares", type=int, default=0, show_default=True,
              help="Extra nodes that stand by to take a lost node's place.")
@click.option("--idle-stop", default="30m", show_default=True, metavar="DURATION",
              help="The nodes stop themselves after this long without a task (20m, 2h).")
@click.option("--image", help="Container image for the nodes (cloud providers).")
@click.option("--region")
@click.option("--volume", "volume", multiple=True, metavar="PATH=NAME[:SIZE_GB[:file|block]]",
              help="Volume the nodes mount at PATH (repeatable).")
@click.option("--max-price-per-hour", type=float, help="Cap in USD per node-hour.")
@click.option("--priority", type=click.Choice(["low", "med", "high"]))
@click.option("--boot-timeout", type=float, metavar="SECONDS",
              help="How long a node may take from launch until its daemon is up.")
@click.option("--provider", default="local", show_default=True)
@click.option("--provider-config", metavar="JSON", help="Provider settings as a JSON object.")
@click.option("--json", "as_json", is_flag=True, help="Print the pool as JSON.")
def pool_up_command(name: str, gpu: str | None, num_instances: int, spares: int,
                    idle_stop: str, image: str | None, region: str | None,
                    volume: tuple[str, ...], max_price_per_hour: float | None,
                    priority: str | None, boot_timeout: float | None, provider: str,
                    provider_config: str | None, as_json: bool) -> None:
    """Start the pool NAME and return once every node is warm."""
    options: dict[str, Any] = {k: v for k, v in {
        "gpu": gpu, "image": image, "region": region, "max_price_per_hour": max_price_per_hour,
        "priority": priority, "boot_timeout_s": boot_timeout}.items() if v is not None}
    if volume:
        options["volumes"] = _volumes(volume)
    started = time.monotonic()
    config = provider_config_of(provider_config)
    try:
        pool = pool_up(name, provider=provider, provider_config=config,
                       num_instances=num_instances, spares=spares, idle_stop=idle_stop,
                       **options)
    except ValidationError as exc:  # named by the flags this command was given
        raise type(exc)(as_passed(exc.problems, config)) from None
    status = pool.status()
    if as_json:
        emit_json(dataclasses.asdict(status))
        return
    click.echo(f"pool {name} is up ({pool.pool_id}): {len(status.nodes)} warm node(s) in "
               f"{time.monotonic() - started:.1f}s; run on it with pool={name!r} or "
               f"`flow run --pool {name}`")


@pool_group.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def pool_list_command(as_json: bool) -> None:
    """Every pool this machine made: its nodes, state, idle time, $/h and auto-stop time."""
    pools = list_pools()
    if as_json:
        emit_json([dataclasses.asdict(p) for p in pools])
        return
    now = time.time()
    click.echo(table(["NAME", "PROVIDER", "STATE", "NODES", "IDLE", "$/H", "AUTO-STOP"],
                     [_row(p, now) for p in pools]))


def _row(pool: PoolStatus, now: float) -> list[object]:
    row = pool_row(pool, now)
    states = ", ".join(f"{count} {state}" for state, count in row.node_states.items()) or "none"
    idle = "-" if row.idle_s is None else f"{row.idle_s:.0f}s"
    stop = "-" if row.stop_in_s is None else (
        f"in {row.stop_in_s:.0f}s" if row.stop_in_s > 0 else "now")
    return [row.name, row.provider, row.state, f"{row.live_nodes} ({states})", idle,
            f"{row.usd_per_hour:.4f}", stop]


@pool_group.command(name="down")
@click.argument("name")
def pool_down_command(name: str) -> None:
    """Stop every node of the pool NAME (a task running on it is cancelled) and forget it."""
    Pool.named(name).down()
    click.echo(f"pool {name} is down")
