"""Options and arguments shared by several ``flow`` commands: the decorator's options,
``--provider-config``, task references, durations and node indexes."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from flow_sdk.errors import FieldProblem, ProviderError, TaskNotFoundError, ValidationError
from flow_sdk.providers import Provider, get_provider
from flow_sdk.client.records import list_client_records
from flow_sdk.client.task import Task

F = TypeVar("F", bound=Callable[..., Any])


def _key_values(values: tuple[str, ...], form: str, option: str) -> dict[str, str]:
    found = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: write {form}", param_hint=option)
        found[key] = value
    return found


def _volumes(values: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    volumes: dict[str, dict[str, Any]] = {}
    for item in values:
        path, sep, rest = item.partition("=")
        parts = rest.split(":") if sep else []
        if not path or not parts or not parts[0] or len(parts) > 3:
            raise click.BadParameter(f"{item!r}: write PATH=NAME[:SIZE_GB[:file|block]], e.g. "
                                     "/shared/ckpt=ckpt:500:file", param_hint="--volume")
        volume: dict[str, Any] = {"name": parts[0]}
        if len(parts) > 1:
            if not parts[1].isdigit():
                raise click.BadParameter(f"{item!r}: SIZE_GB must be a whole number",
                                         param_hint="--volume")
            volume["size_gb"] = int(parts[1])
        if len(parts) > 2:
            volume["interface"] = parts[2]
        volumes[path] = volume
    return volumes


def spec_options(fn: F) -> F:
    """The decorator's options as command-line options (``@app.function(...)`` names)."""
    options = [
        click.option("--gpu", help="GPUs per node, e.g. h100:8, a100-80gb:4 (default: CPU)."),
        click.option("-N", "--num-instances", "--nodes", type=int, help="Nodes (default 1)."),
        click.option("--min-instances", type=int,
                     help="Start with this many when not all nodes arrive in time."),
        click.option("--workers-per-node", type=int,
                     help="Worker processes per CPU node (one per GPU otherwise)."),
        click.option("--distributed-mode", type=click.Choice(["auto", "manual"])),
        click.option("--env", "env", multiple=True, metavar="KEY=VALUE",
                     help="Environment variable for the workers (repeatable)."),
        click.option("--image", help="Container image for the nodes (cloud providers)."),
        click.option("--region"),
        click.option("--volume", "volume", multiple=True,
                     metavar="PATH=NAME[:SIZE_GB[:file|block]]",
                     help="Persistent volume mounted at PATH (repeatable)."),
        click.option("--mount", "mount", multiple=True, metavar="PATH=s3://BUCKET/PREFIX",
                     help="Read-only S3 mount (repeatable)."),
        click.option("--max-price-per-hour", type=float, help="Cap in USD per node-hour."),
        click.option("--max-run-time-hours", type=float, help="Stop the task after this long."),
        click.option("--priority", type=click.Choice(["low", "med", "high"])),
        click.option("--interconnect", type=click.Choice(["ethernet", "efa", "infiniband"])),
        click.option("--intranode-interconnect", metavar="LINK",
                     help="How a node's GPUs are linked: sxm5 (h100, h200), sxm4 (a100), pcie, "
                          "... (checked against the GPU catalog)."),
        click.option("--boot-timeout", type=float, metavar="SECONDS",
                     help="How long a node may take from launch until its agent is up."),
        click.option("--availability-timeout", type=float, metavar="SECONDS",
                     help="How long nodes wait for each other, from the first one up."),
        click.option("--max-restarts", type=int),
        click.option("--restart-on", type=click.Choice(["infra", "any"]),
                     help="Restart after infra failures only (default), or after any."),
        click.option("--stall-timeout", metavar="DURATION|auto|off",
                     help="A rank with no output or step this long is stalled (default auto)."),
        click.option("--on-stall", type=click.Choice(["warn", "fail"]),
                     help="What a stall does: warn (default) or fail the task."),
        click.option("--collective-timeout", metavar="DURATION",
                     help="torch.distributed's default process-group timeout (default 10m)."),
        click.option("--run-on", type=click.Choice(["every_worker", "head"]),
                     help="every_worker (default): on every worker, as torchrun does; head: "
                          "on node 0 only, the other nodes serve its trainers (Snowflake jobs)."),
        click.option("--key-name", help="EC2 key pair for your own SSH access."),
        click.option("--preflight", is_flag=True, default=None,
                     help="Before user code runs, prove every node pair can talk."),
        click.option("--include", "include", multiple=True, metavar="MODULE",
                     help="Ship this installed module by value too (repeatable)."),
        click.option("--pool", help="Run on this pool of warm nodes (made with the task's "
                                    "shape when it does not exist)."),
        click.option("--idle-stop", metavar="DURATION",
                     help="A pool the task makes stops after this long idle, e.g. 20m."),
        click.option("--spares", type=int, help="Spare nodes of a pool the task makes."),
        click.option("--provider", default="local", show_default=True),
        click.option("--provider-config", metavar="JSON",
                     help="Provider settings as a JSON object."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def spec_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """The decorator keyword arguments the command line set (unset ones are left out)."""
    names = {"gpu": "gpu", "num_instances": "num_instances", "min_instances": "min_instances",
             "workers_per_node": "workers_per_node", "distributed_mode": "distributed_mode",
             "image": "image", "region": "region", "max_price_per_hour": "max_price_per_hour",
             "max_run_time_hours": "max_run_time_hours", "priority": "priority",
             "interconnect": "internode_interconnect",
             "intranode_interconnect": "intranode_interconnect",
             "availability_timeout": "availability_timeout_s", "max_restarts": "max_restarts",
             "boot_timeout": "boot_timeout_s",
             "key_name": "key_name", "preflight": "preflight",
             "run_on": "run_on", "pool": "pool", "idle_stop": "idle_stop", "spares": "spares",
             "restart_on": "restart_on", "stall_timeout": "stall_timeout",
             "on_stall": "on_stall", "collective_timeout": "collective_timeout"}
    options = {target: params[source] for source, target in names.items()
               if params.get(source) is not None}
    if params.get("env"):
        options["environment"] = _key_values(params["env"], "KEY=VALUE", "--env")
    if params.get("volume"):
        options["volumes"] = _volumes(params["volume"])
    if params.get("include"):
        options["include"] = list(params["include"])
    if params.get("mount"):
        options["mounts"] = _key_values(params["mount"], "PATH=s3://BUCKET/PREFIX", "--mount")
    return options


def provider_config_of(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--provider-config") from exc
    if not isinstance(config, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--provider-config")
    return config


def find_task(ref: str | None) -> Task:
    """The task named by id or unique id prefix; the newest task when ``ref`` is None."""
    records = list_client_records()
    if ref is None:
        if not records:
            raise TaskNotFoundError("no tasks on this machine yet; start one with `flow run`")
        newest = max(records, key=lambda r: r.get("created_at", 0.0))
        return Task.from_id(newest["task_id"])
    ids = [r["task_id"] for r in records]
    if ref in ids:
        return Task.from_id(ref)
    matches = [i for i in ids if i.startswith(ref)]
    if len(matches) == 1:
        return Task.from_id(matches[0])
    if len(matches) > 1:
        raise click.UsageError(f"{ref!r} matches {len(matches)} tasks: "
                               f"{', '.join(sorted(matches)[:5])}; give more of the id")
    return Task.from_id(ref)  # raises TaskNotFoundError naming where it looked


_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def since_time(text: str | None) -> float | None:
    """``90s``, ``10m``, ``2h``, ``1d`` ago, or an epoch time in seconds."""
    if text is None:
        return None
    match = _DURATION_RE.match(text.strip())
    if match:
        scale = {"s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]
        return time.time() - float(match[1]) * scale
    try:
        return float(text)
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: write a duration such as 10m or 2h, or an "
                                 "epoch time in seconds", param_hint="--since") from exc


def as_passed(problems: list[FieldProblem], config: dict[str, Any] | None
              ) -> list[FieldProblem]:
    """``problems`` under the flags the user passed: without ``--provider-config``, what a
    provider finds wrong with its own configuration comes from the defaults ``--provider``
    chose, so it is reported under ``--provider``."""
    if config is not None:
        return problems
    return [FieldProblem("provider", p.message) if p.field == "provider_config" else p
            for p in problems]


def refuse(problems: list[FieldProblem], config: dict[str, Any] | None) -> None:
    """Raise ``ValidationError`` for ``problems`` (named as ``as_passed`` does), if any."""
    if problems:
        raise ValidationError(as_passed(problems, config))


def backend(name: str, config: dict[str, Any] | None) -> Provider:
    """The provider named by ``--provider``; an unknown name or a bad ``--provider-config``
    is a usage error (exit 2) naming the option."""
    try:
        return get_provider(name, config)
    except ProviderError as exc:
        field = "provider_config" if config else "provider"
        raise ValidationError([FieldProblem(field, str(exc))]) from None
