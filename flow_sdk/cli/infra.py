"""Commands about providers rather than one task: plan, gc, volumes, catalog."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from typing import Any

import click

from flow_sdk import lifecycle
from flow_sdk.cli._exits import EXIT_FAILED, EXIT_OK
from flow_sdk.cli._main import main
from flow_sdk.cli._options import F, backend, provider_config_of, refuse, spec_kwargs, spec_options
from flow_sdk.cli._output import emit_json, table
from flow_sdk.errors import (
    FieldProblem,
    FlowError,
    ServiceNotRunningError,
    ValidationError,
    install_hint,
)
from flow_sdk.providers import attach_provider, available_providers
from flow_sdk.spec import TaskSpec, build_task_spec
from flow_sdk.client.records import list_client_records
from flow_sdk.home.poolfiles import list_pool_files


@main.command()
@spec_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def plan(provider: str, provider_config: str | None, as_json: bool, **spec: Any) -> None:
    """Show what a run with these options would launch, and what it would cost. Launches
    nothing."""
    task_spec = build_task_spec(app="flow-plan", name="plan", provider=provider,
                                **spec_kwargs(spec))
    config = provider_config_of(provider_config)
    chosen_backend = backend(provider, config)
    refuse(chosen_backend.problems(task_spec), config)
    chosen = chosen_backend.plan(task_spec)
    notes = chosen_backend.notes(task_spec)
    data = {**dataclasses.asdict(chosen), "processes": chosen.processes,
            "cost_per_hour": chosen.cost_per_hour, "cost_at_cap": chosen.cost_at_cap,
            "notes": notes}
    for warning in chosen.warnings:  # a plan launches nothing: what a launch refuses, it warns
        click.echo(f"flow: warning: a launch would be refused: {warning}", err=True)
    for note in notes:
        click.echo(f"flow: note: {note}", err=True)
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
    """(provider, config) pairs: those named, else the default provider plus every provider
    configuration this machine's tasks and pools used, each distinct one once."""
    if names:
        return [(name, None) for name in names]
    default = TaskSpec.model_fields["provider"].default
    targets: list[tuple[str, dict[str, Any] | None]] = [(default, None)]
    seen = {(default, json.dumps(attach_provider(default).config(), sort_keys=True))}
    used = [(rec["provider"], rec.get("provider_config")) for rec in list_client_records()]
    used += [(pool.provider, pool.provider_config) for pool in list_pool_files()]
    for name, config in used:
        key = (name, json.dumps(config or {}, sort_keys=True))
        if key not in seen:
            seen.add(key)
            targets.append((name, config))
    return targets


_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _duration(_ctx: click.Context, _param: click.Parameter, value: str | None
              ) -> float | None:
    """``--older-than`` in seconds: a number and a unit (s, m, h, d, w), e.g. 7d or 12h."""
    if value is None:
        return None
    match = _DURATION_RE.match(value.strip().lower())
    if match is None:
        raise click.BadParameter(f"{value!r} is not a duration such as 7d, 12h, 30m or 2w")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def _gc_failed(reports: list[dict[str, Any]], name: str, exc: FlowError, as_json: bool) -> None:
    reports.append({"provider": name, "error": str(exc)})
    if not as_json:
        click.echo(f"{name}: {exc}", err=True)


@main.command()
@click.option("--provider", "providers", multiple=True,
              help="Only this provider (repeatable). Default: local and every provider "
                   "this machine's tasks used.")
@click.option("--dry-run", is_flag=True, help="Only say what would be stopped.")
@click.option("--older-than", "older_than_s", callback=_duration, metavar="DURATION",
              help="Also remove the stored objects (records, payloads, results) of tasks "
                   "that finished more than DURATION ago, e.g. 7d or 12h; never those of a "
                   "running task.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def gc(providers: tuple[str, ...], dry_run: bool, older_than_s: float | None,
       as_json: bool) -> None:
    """Stop what ended or orphaned tasks left running (processes, instances, resources);
    with --older-than, also remove finished tasks' stored objects."""
    unknown = [name for name in providers if name not in available_providers()]
    if unknown:  # a usage error, before anything runs
        raise ValidationError([FieldProblem("provider", (
            f"unknown provider(s) {', '.join(unknown)}; available: "
            f"{', '.join(available_providers())}"))])
    reports: list[dict[str, Any]] = []
    failed = False
    known = {rec["task_id"] for rec in list_client_records()}
    for name, config in _gc_targets(providers):
        try:
            backend = attach_provider(name, config)
            report = lifecycle.collect(backend, known, dry_run=dry_run)
        except ServiceNotRunningError as exc:  # nothing of it runs, so nothing to reclaim
            reports.append({"provider": name, "not_running": str(exc)})
            if not as_json:
                click.echo(f"{name}: nothing to reclaim: {exc}")
            continue
        except FlowError as exc:
            failed = True
            _gc_failed(reports, name, exc, as_json)
            continue
        reports.append({"provider": name, **dataclasses.asdict(report)})
        if not as_json:
            click.echo(str(report))
        if older_than_s is not None:
            try:
                objects = lifecycle.remove_finished_objects(backend, older_than_s,
                                                            dry_run=dry_run)
            except FlowError as exc:
                failed = True
                _gc_failed(reports, name, exc, as_json)
                continue
            reports.append({"provider": name, "objects": dataclasses.asdict(objects)})
            if not as_json:
                click.echo(f"{name}: {objects}")
        if not dry_run and backend.volumes.shared_mount_caches() is not None:
            from flow_sdk.node.volumes.prepare import gc_mount_caches

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
                        help="local, aws or aws-sim.")(fn)


@volumes_group.command(name="list")
@_volume_target
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def volumes_list(provider: str, region: str | None, provider_config: str | None,
                 as_json: bool) -> None:
    """List volumes: name, interface, size, the tasks using them, where they live."""
    from flow_sdk.volumes import list_volumes

    found = list_volumes(provider, region=region,
                         provider_config=provider_config_of(provider_config))
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
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def volumes_create(name: str, size_gb: int, interface: str, zone: str | None, provider: str,
                   region: str | None, provider_config: str | None, as_json: bool) -> None:
    """Create a volume (nothing happens when it exists with the same interface)."""
    from flow_sdk.volumes import create_volume

    info = create_volume(name, size_gb, interface, provider=provider, region=region, zone=zone,
                         provider_config=provider_config_of(provider_config))
    if as_json:
        emit_json(dataclasses.asdict(info))
        return
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
                         provider_config=provider_config_of(provider_config)):
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
        raise FlowError(install_hint("catalog refresh", "boto3")) from exc
    from flow_sdk.catalog import refresh_catalog

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


