"""``flow``: run scripts as multi-node tasks and look after them from the shell.

    flow run -N 2 --workers-per-node 2 train.py --epochs 3
    flow status; flow list; flow logs TASK -f; flow ssh TASK --node 1
    flow cancel TASK; flow plan --gpu h100:8 -N 4 --provider aws; flow gc
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click

import flow_sdk
from flow_sdk.app import FlowApp
from flow_sdk.cli._output import Progress, ago, emit_json, pairs, table, when
from flow_sdk.errors import (
    FlowError,
    SshError,
    TaskCancelledError,
    TaskNotFoundError,
    TaskTimedOutError,
    ValidationError,
)
from flow_sdk.protocol import TaskStatus
from flow_sdk.providers import get_provider
from flow_sdk.spec import build_task_spec
from flow_sdk.task import LOG_SOURCES, Task, list_client_records

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_STOPPED = 3
EXIT_SSH = 255
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """\b
Exit codes:
  0    success: the task SUCCEEDED, or the command did what was asked
  1    the task FAILED, or a provider call failed
  2    usage or validation error (bad option, unknown task); nothing was launched
  3    the task was CANCELLED or TIMED_OUT
  130  interrupted (Ctrl-C); `flow run` cancels the task it started
  255  `flow ssh` could not connect (otherwise it exits with the remote command's code)
`flow status TASK` exits with the code of the task's state (0 while it runs)."""

F = TypeVar("F", bound=Callable[..., Any])


def exit_code(status: TaskStatus) -> int:
    """The exit code for a task state: 0 running or succeeded, 1 failed, 3 stopped."""
    if status is TaskStatus.FAILED:
        return EXIT_FAILED
    if status in (TaskStatus.CANCELLED, TaskStatus.TIMED_OUT):
        return EXIT_STOPPED
    return EXIT_OK


def _error_code(exc: FlowError) -> int:
    if isinstance(exc, ValidationError | TaskNotFoundError):
        return EXIT_USAGE
    if isinstance(exc, TaskCancelledError | TaskTimedOutError):
        return EXIT_STOPPED
    if isinstance(exc, SshError):
        return EXIT_SSH
    return EXIT_FAILED


class _FlowGroup(click.Group):
    """Turns FlowError and Ctrl-C into a one-line message and a meaningful exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FlowError as exc:
            click.echo(f"flow: {exc}", err=True)
            ctx.exit(_error_code(exc))
        except KeyboardInterrupt:
            click.echo("\nflow: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)


@click.group(cls=_FlowGroup, epilog=EXIT_CODES_HELP,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(flow_sdk.__version__, prog_name="flow")
def main() -> None:
    """Run Python scripts as multi-node GPU tasks, and watch, reach and stop them."""


# -- options shared by `run` and `plan` -------------------------------------------------------


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
        click.option("-N", "--num-instances", type=int, help="Nodes (default 1)."),
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
        click.option("--availability-timeout", type=float, metavar="SECONDS",
                     help="How long nodes wait for each other at the start."),
        click.option("--max-restarts", type=int),
        click.option("--key-name", help="EC2 key pair for your own SSH access."),
        click.option("--provider", default="local", show_default=True),
        click.option("--provider-config", metavar="JSON",
                     help="Provider settings as a JSON object."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _spec_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """The decorator keyword arguments the command line set (unset ones are left out)."""
    names = {"gpu": "gpu", "num_instances": "num_instances", "min_instances": "min_instances",
             "workers_per_node": "workers_per_node", "distributed_mode": "distributed_mode",
             "image": "image", "region": "region", "max_price_per_hour": "max_price_per_hour",
             "max_run_time_hours": "max_run_time_hours", "priority": "priority",
             "interconnect": "internode_interconnect",
             "availability_timeout": "availability_timeout_s", "max_restarts": "max_restarts",
             "key_name": "key_name"}
    options = {target: params[source] for source, target in names.items()
               if params.get(source) is not None}
    if params.get("env"):
        options["environment"] = _key_values(params["env"], "KEY=VALUE", "--env")
    if params.get("volume"):
        options["volumes"] = _volumes(params["volume"])
    if params.get("mount"):
        options["mounts"] = _key_values(params["mount"], "PATH=s3://BUCKET/PREFIX", "--mount")
    return options


def _provider_config(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--provider-config") from exc
    if not isinstance(config, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--provider-config")
    return config


# -- finding tasks ----------------------------------------------------------------------------


def _task(ref: str | None) -> Task:
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


# -- run ----------------------------------------------------------------------------------------


@main.command(context_settings={"ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@spec_options
@click.option("--entrypoint", help="For a directory: the script inside it (default main.py).")
@click.option("--app", "app_name", default="flow-run", show_default=True,
              help="App name recorded with the task.")
@click.option("-d", "--detach", is_flag=True, help="Print the task id and return at once.")
@click.option("--source", type=click.Choice(LOG_SOURCES), default="workers", show_default=True,
              help="Which logs to stream while waiting.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON on stdout "
              "(logs go to stderr).")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(path: Path, args: tuple[str, ...], entrypoint: str | None, app_name: str, detach: bool,
        source: str, as_json: bool, provider: str, provider_config: str | None,
        **spec: Any) -> None:
    """Run a script (or a directory's entry point) on every worker of every node, stream
    its logs, and exit with the task's code. Options go before PATH; everything after PATH is
    passed to the script.

    \b
        flow run -N 2 --workers-per-node 2 train.py --epochs 3
        flow run --gpu h100:8 -N 4 --provider aws --max-run-time-hours 12 train.py
        flow run --entrypoint src/main.py ./project --lr 0.1
    """
    options = _spec_kwargs(spec)
    app = FlowApp(app_name, provider=provider, provider_config=_provider_config(provider_config))
    if path.is_dir():
        task = app.submit_directory(path, entrypoint=entrypoint or "main.py", args=args,
                                    **options)
    else:
        if entrypoint is not None:
            raise click.UsageError("--entrypoint is for directories; PATH is a file")
        task = app.submit_file(path, args=args, **options)
    if detach:
        if as_json:
            emit_json({"task_id": task.task_id, "status": str(task.status)})
        else:
            click.echo(task.task_id)
        return
    click.echo(f"flow: task {task.task_id} started ({provider}); `flow logs {task.task_id}`, "
               f"`flow cancel {task.task_id}`", err=True)
    started = time.monotonic()
    try:
        status = _watch(task, source, logs_to_stderr=as_json)
    except KeyboardInterrupt:
        task.cancel()
        click.echo(f"\nflow: interrupted: task {task.task_id} cancelled", err=True)
        sys.exit(EXIT_INTERRUPTED)
    outcome = task.outcome()
    elapsed = time.monotonic() - started
    if as_json:
        emit_json({"task_id": task.task_id, "status": str(status),
                   "message": outcome.message if outcome else None,
                   "node": outcome.node if outcome else None,
                   "rank": outcome.rank if outcome else None,
                   "exit_code": exit_code(status), "elapsed_s": round(elapsed, 3)})
    else:
        line = f"flow: task {task.task_id} {status} after {elapsed:.1f}s"
        if status is not TaskStatus.SUCCEEDED and outcome is not None:
            line += f": {outcome.message}"
        click.echo(line, err=True)
    sys.exit(exit_code(status))


def _watch(task: Task, source: str, logs_to_stderr: bool) -> TaskStatus:
    """Show 'waiting for nodes k/N' until the task runs, then stream its logs until it ends;
    tears the nodes down and returns the terminal state."""
    progress = Progress()
    expected = task.record().spec.get("num_instances", 1)
    status = task.status
    while status in (TaskStatus.PENDING, TaskStatus.PROVISIONING):
        joined = len(task.nodes())
        progress.show(f"{status}: waiting for nodes {joined}/{expected}")
        time.sleep(0.2)
        status = task.status
    progress.done()
    for line in task.logs(follow=True, source=source):  # type: ignore[call-overload]
        click.echo(line, err=logs_to_stderr)
    return task.wait()


# -- status, list -------------------------------------------------------------------------------


def _status_data(task: Task) -> dict[str, Any]:
    status = task.status
    record = task.record()
    outcome = task.outcome()
    instances = {i.instance_id: i for i in task.provider.list_instances(task.task_id)}
    nodes = []
    for node in sorted(task.nodes(), key=lambda n: n.node):
        instance = instances.get(node.instance_id)
        ssh = instance.ssh if instance is not None else None
        nodes.append({"node": node.node, "instance_id": node.instance_id,
                      "address": node.address, "phase": node.phase, "workers": node.workers,
                      "state": instance.state if instance is not None else "unknown",
                      "ssh": f"{ssh.user}@{ssh.host}:{ssh.port}"
                      if ssh is not None and instance is not None and instance.state == "running"
                      else None})
    return {"task_id": task.task_id, "status": str(status), "provider": task.provider.name,
            "name": record.spec.get("name"), "app": record.spec.get("app"),
            "created_at": record.created_at, "num_instances": record.spec.get("num_instances"),
            "outcome": dataclasses.asdict(outcome) if outcome is not None else None,
            "nodes": nodes,
            "instances": [{"instance_id": i.instance_id, "address": i.address,
                           "state": i.state} for i in instances.values()]}


@main.command()
@click.argument("task_ref", metavar="[TASK]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(task_ref: str | None, as_json: bool) -> None:
    """Show a task's state, nodes and outcome (default: the newest task)."""
    task = _task(task_ref)
    data = _status_data(task)
    if as_json:
        emit_json(data)
    else:
        rows: list[tuple[str, object]] = [
            ("task", data["task_id"]), ("name", f"{data['app']}/{data['name']}"),
            ("provider", data["provider"]), ("status", data["status"]),
            ("created", when(data["created_at"])),
            ("nodes", f"{len(data['nodes'])} of {data['num_instances']} joined")]
        outcome = data["outcome"]
        if outcome is not None:
            rows.append(("outcome", outcome["message"]))
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
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_tasks(limit: int, as_json: bool) -> None:
    """List the tasks this machine started, newest first."""
    records = sorted(list_client_records(), key=lambda r: r.get("created_at", 0.0), reverse=True)
    if limit > 0:
        records = records[:limit]
    rows = []
    for rec in records:
        try:
            task = Task.from_id(rec["task_id"])
            state = str(task.status)
            spec = task.record().spec
            nodes = spec.get("num_instances")
        except FlowError as exc:  # one unreachable provider must not hide the others
            state, nodes = f"UNKNOWN ({exc})", None
        rows.append({"task_id": rec["task_id"], "name": rec.get("name"),
                     "provider": rec.get("provider"), "status": state, "nodes": nodes,
                     "created_at": rec.get("created_at")})
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("no tasks yet; start one with `flow run FILE.py`")
        return
    now = time.time()
    click.echo(table(["TASK", "NAME", "PROVIDER", "STATUS", "NODES", "CREATED"],
                     [[r["task_id"], r["name"], r["provider"], r["status"], r["nodes"],
                       ago(r["created_at"], now) if r["created_at"] else "-"]
                      for r in rows]))


# -- logs, ssh, cancel --------------------------------------------------------------------------

_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def _since(text: str | None) -> float | None:
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


@main.command()
@click.argument("task_ref", metavar="TASK")
@click.option("--node", type=int, help="Only this node's lines.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the task ends.")
@click.option("--tail", type=int, help="Only the last N lines (then follow, with -f).")
@click.option("--since", help="Only lines from this long ago (10m, 2h) or this epoch time.")
@click.option("--source", type=click.Choice(LOG_SOURCES), default="workers", show_default=True,
              help="workers: what user code printed; agent: the node agents; boot: each "
                   "node's raw boot output; all: everything.")
def logs(task_ref: str, node: int | None, follow: bool, tail: int | None, since: str | None,
         source: str) -> None:
    """Print a task's logs, labelled [Node i] [HH:MM:SS], merged in time order."""
    task = _task(task_ref)
    lines: Iterator[str] | list[str] = task.logs(  # type: ignore[call-overload]
        node=node, tail=tail, follow=follow, since=_since(since), source=source)
    for line in lines:
        click.echo(line)
    if follow:
        task.wait()  # the task ended: tear down what is left of its nodes


@main.command()
@click.argument("task_ref", metavar="TASK")
@click.option("--node", type=int, default=0, show_default=True)
@click.option("-c", "--command", help="Run this command and exit with its code; without it, "
              "an interactive shell.")
@click.option("--timeout", type=float, help="Seconds the command may run.")
def ssh(task_ref: str, node: int, command: str | None, timeout: float | None) -> None:
    """Open a shell on a node, or run a command there (host key pinned at launch)."""
    task = _task(task_ref)
    if command is None:
        sys.exit(task.ssh(node=node))
    result = task.ssh(node=node, command=command, timeout=timeout)
    click.echo(result.stdout, nl=False)
    click.echo(result.stderr, nl=False, err=True)
    sys.exit(result.exit_code)


@main.command()
@click.argument("task_ref", metavar="TASK")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def cancel(task_ref: str, as_json: bool) -> None:
    """Stop every worker on every node and tear the nodes down."""
    task = _task(task_ref)
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


# -- plan, gc -----------------------------------------------------------------------------------


@main.command()
@spec_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def plan(provider: str, provider_config: str | None, as_json: bool, **spec: Any) -> None:
    """Show what a run with these options would launch, and what it would cost. Launches
    nothing."""
    task_spec = build_task_spec(app="flow-plan", name="plan", provider=provider,
                                **_spec_kwargs(spec))
    backend = get_provider(provider, _provider_config(provider_config))
    problems = backend.check(task_spec)
    if problems:
        raise ValidationError(problems)
    chosen = backend.plan(task_spec)
    data = {**dataclasses.asdict(chosen), "processes": chosen.processes,
            "cost_per_hour": chosen.cost_per_hour, "cost_at_cap": chosen.cost_at_cap}
    if as_json:
        emit_json(data)
        return
    if chosen.summary:
        click.echo(chosen.summary)
        return
    cap = (f"${chosen.cost_at_cap:,.2f} at the {chosen.max_run_time_hours:g} h cap"
           if chosen.cost_at_cap is not None else "no runtime cap set")
    click.echo(table(["PROVIDER", "INSTANCE TYPE", "REGION", "MARKET", "$/H PER NODE", "NODES",
                      "$/H TOTAL", "AT CAP"],
                     [[chosen.provider, chosen.instance_type,
                       chosen.region + (f" ({chosen.zone})" if chosen.zone else ""),
                       chosen.market, f"{chosen.usd_per_hour:,.2f}", chosen.nodes,
                       f"{chosen.cost_per_hour:,.2f}", cap]]))
    if chosen.alternatives:
        click.echo(f"{chosen.alternatives} more offer(s) would be tried in order if this one "
                   "has no capacity")


def _gc_targets(names: tuple[str, ...]) -> list[tuple[str, dict[str, Any] | None]]:
    """(provider, config) pairs: those named, else local plus every other provider this
    machine's tasks used (each distinct configuration once)."""
    if names:
        return [(name, None) for name in names]
    targets: list[tuple[str, dict[str, Any] | None]] = [("local", None)]
    seen = {("local", "null")}
    for rec in list_client_records():
        key = (rec["provider"], json.dumps(rec.get("provider_config"), sort_keys=True))
        if rec["provider"] != "local" and key not in seen:
            seen.add(key)
            targets.append((rec["provider"], rec.get("provider_config")))
    return targets


@main.command()
@click.option("--provider", "providers", multiple=True,
              help="Only this provider (repeatable). Default: local and every provider "
                   "this machine's tasks used.")
@click.option("--dry-run", is_flag=True, help="Only say what would be stopped.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def gc(providers: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Stop what ended or orphaned tasks left running (processes, instances, resources)."""
    reports: list[dict[str, Any]] = []
    failed = False
    for name, config in _gc_targets(providers):
        try:
            backend = get_provider(name, config)
            report = backend.gc(dry_run=dry_run)
        except FlowError as exc:
            failed = True
            reports.append({"provider": name, "error": str(exc)})
            if not as_json:
                click.echo(f"{name}: {exc}", err=True)
            continue
        reports.append({"provider": name, **dataclasses.asdict(report)})
        if not as_json:
            click.echo(str(report))
        if not dry_run and backend.volumes.shared_mount_caches() is not None:
            from flow_sdk.volumes import gc_mount_caches

            removed = gc_mount_caches(backend)
            reports.append({"provider": name, "mount_caches_removed": removed})
            if not as_json:
                click.echo(f"{name}: removed {removed} S3 mount cache(s) of ended tasks")
    if as_json:
        emit_json(reports)
    sys.exit(EXIT_FAILED if failed else EXIT_OK)


# -- volumes ------------------------------------------------------------------------------------


@main.group(name="volumes")
def volumes_group() -> None:
    """Named volumes that outlive tasks: list, create, delete."""


def _volume_target(fn: F) -> F:
    fn = click.option("--provider-config",
                      help="Provider settings as JSON, e.g. '{\"region\": \"us-west-2\"}'.")(fn)
    fn = click.option("--region", help="aws: the region of the volumes.")(fn)
    return click.option("--provider", default="local", show_default=True,
                        help="local or aws.")(fn)


@volumes_group.command(name="list")
@_volume_target
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def volumes_list(provider: str, region: str | None, provider_config: str | None,
                 as_json: bool) -> None:
    """List volumes: name, interface, size, the tasks using them, where they live."""
    from flow_sdk.volumes import list_volumes

    found = list_volumes(provider, region=region,
                         provider_config=_provider_config(provider_config))
    if as_json:
        emit_json([dataclasses.asdict(v) for v in found])
        return
    click.echo(table(["NAME", "INTERFACE", "SIZE_GB", "IN USE BY", "LOCATION"],
                     [[v.name, v.interface, "-" if v.size_gb is None else v.size_gb,
                       ", ".join(v.in_use_by) or "-", v.location] for v in found]))


@volumes_group.command(name="create")
@click.argument("name")
@click.option("--size-gb", type=int, default=100, show_default=True)
@click.option("--interface", type=click.Choice(["file", "block"]), default="file",
              show_default=True,
              help="file: shared by every node (EFS on aws); block: one node (EBS on aws).")
@click.option("--zone", help="aws block volumes: the availability zone to create it in.")
@_volume_target
def volumes_create(name: str, size_gb: int, interface: str, zone: str | None, provider: str,
                   region: str | None, provider_config: str | None) -> None:
    """Create a volume (nothing happens when it exists with the same interface)."""
    from flow_sdk.volumes import create_volume

    info = create_volume(name, size_gb, interface, provider=provider, region=region, zone=zone,
                         provider_config=_provider_config(provider_config))
    click.echo(f"{info.name}: {info.interface} volume, {info.size_gb} GB, {info.location}")


@volumes_group.command(name="delete")
@click.argument("name")
@click.option("--force", is_flag=True,
              help="Delete even while a running task uses it (local file volumes).")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@_volume_target
def volumes_delete(name: str, force: bool, yes: bool, provider: str, region: str | None,
                   provider_config: str | None) -> None:
    """Delete a volume and every file in it."""
    from flow_sdk.volumes import delete_volume

    if not yes:
        click.confirm(f"delete volume {name!r} and all its data?", abort=True)
    if not delete_volume(name, provider=provider, region=region, force=force,
                         provider_config=_provider_config(provider_config)):
        raise click.ClickException(f"no volume named {name!r} on {provider}")
    click.echo(f"deleted volume {name!r}")


# -- catalog ------------------------------------------------------------------------------------


@main.group(name="catalog")
def catalog_group() -> None:
    """The instance catalog: offers and prices used by plan, caps and failover."""


@catalog_group.command(name="refresh")
@click.option("--region", "regions", multiple=True,
              help="Only this region (repeatable). Default: every region in the catalog.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def catalog_refresh(regions: tuple[str, ...], as_json: bool) -> None:
    """Fetch on-demand prices (AWS Price List API) and spot prices (spot price history) and
    write the user's catalog copy, which then overrides the packaged one."""
    try:
        import boto3
    except ImportError as exc:
        raise FlowError("catalog refresh needs boto3: pip install 'flow-sdk[aws]'") from exc
    from flow_sdk.catalog.refresh import refresh_catalog

    report = refresh_catalog(boto3.Session(), regions=list(regions) or None)
    data = {"written_to": str(report.written_to), "on_demand_prices": len(report.on_demand),
            "spot_prices": len(report.spot),
            "missing": [f"{t} in {r}" for t, r in report.missing]}
    if as_json:
        emit_json(data)
        return
    click.echo(f"wrote {report.written_to}: {len(report.on_demand)} on-demand and "
               f"{len(report.spot)} spot prices")
    if report.missing:
        click.echo("no on-demand price found for: " + ", ".join(data["missing"]), err=True)


# -- doctor -------------------------------------------------------------------------------------


@main.command()
@click.argument("task_ref", metavar="TASK")
@click.option("--timeout", type=float, default=3.0, show_default=True,
              help="Seconds each connection attempt may take.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def doctor(task_ref: str, timeout: float, as_json: bool) -> None:
    """Check that every node of a running task reaches every other node (their SSH ports) and
    the leader's rendezvous port. Exits 1 when a pair cannot talk."""
    from flow_sdk.doctor import check_task

    checks = check_task(_task(task_ref), timeout_s=timeout)
    if as_json:
        emit_json([dataclasses.asdict(c) for c in checks])
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
