"""Launching a task's gang: the catalog's offers, each in the zones that offer it, through the
one failover loop (``_launch.failover``); the task's volumes provisioned per attempt; the
runtime told to start the nodes; anything left by failed tries removed."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping

from botocore.exceptions import BotoCoreError, ClientError

from flow_sdk.catalog import Offer
from flow_sdk.errors import CapacityError, ProviderError, VolumeError
from flow_sdk.providers.aws import _userdata
from flow_sdk.providers.aws._launch import (
    Attempt,
    AttemptPlan,
    Try,
    failover,
    format_attempts,
    terminate_tagged,
)
from flow_sdk.providers.aws._nodes import AwsNodes
from flow_sdk.providers.aws._resources import (
    RegionContext,
    caller_cidr,
    delete_resources,
    tagged_resources,
)
from flow_sdk.providers.aws._teardown import terminate_task
from flow_sdk.providers.base import Instance, LaunchRequest


def launch(nodes: AwsNodes, request: LaunchRequest, offers: list[Offer]) -> list[Instance]:
    """Start the task's nodes as one gang (trying ``offers`` in order), or none. However the
    launch fails (an error, a signal), the node role it made for the task goes too."""
    try:
        return _launch(nodes, request, offers)
    except BaseException as exc:
        try:
            nodes.delete_task_role(request.task_id)
        except ProviderError as cleanup:
            exc.add_note(f"{cleanup}; run `flow gc` to remove it")
        raise


def _launch(nodes: AwsNodes, request: LaunchRequest, offers: list[Offer]) -> list[Instance]:
    spec, task_id, cfg = request.spec, request.task_id, nodes.cfg
    efa = _userdata.interconnect_of(spec.internode_interconnect) == "efa"
    nodes.task_efa[task_id] = efa
    contexts: dict[str, RegionContext] = {}
    attempts: list[Attempt] = []
    try:
        code = nodes.ship_code()  # the caller's SDK wheel, in the store before any node
        profile, fresh = nodes.task_profile(task_id, spec, code)  # the task's own role
        ssh_cidr = caller_cidr(cfg)
        block_names = sorted(v.name for v in spec.volumes.values() if v.interface == "block")

        def candidates() -> Iterator[Try]:
            for index, offer in enumerate(offers):
                ctx = contexts.get(offer.region)
                if ctx is None:
                    ctx = contexts[offer.region] = RegionContext(
                        nodes.clients, cfg, offer.region, task_id, nodes.store_tag)
                zones = ctx.zones_for(offer.instance_type)
                pinned = nodes.volumes.block_zone(ctx, task_id, block_names)
                if pinned is not None:
                    zones = [z for z in zones if z == pinned]
                if not zones:
                    where = (f"the block volumes' zone {pinned}" if pinned is not None
                             else "no availability zone")
                    attempts.append(Attempt(None, offer, None, "NotOffered", f"{where} with a "
                                            "default subnet offers this type"))
                    continue
                for zone in zones:
                    if pinned is None and block_names:  # an earlier try created them
                        pinned = nodes.volumes.block_zone(ctx, task_id, block_names)
                        if pinned not in (None, zone):
                            break
                    yield Try(offer, zone, ctx, group=index)

        def plan_for(number: int, candidate: Try) -> AttemptPlan:
            ctx = candidate.ctx
            subnet_id, security_group = ctx.subnets()[candidate.zone], ctx.security_group(
                ssh_cidr)
            mounts_sh = nodes.volumes.provision(ctx, spec, candidate.zone, subnet_id,
                                                security_group)
            user_data = nodes.render_user_data(spec, task_id, candidate.offer.region, number,
                                               request.boot_env, spec.max_run_time_hours,
                                               code, volume_mounts=mounts_sh)
            return AttemptPlan(
                task_id=task_id, spec=spec, offer=candidate.offer, zone=candidate.zone,
                subnet_id=subnet_id, security_group=security_group, ami_id=ctx.ami_id(),
                root_device=ctx.root_device(), key_name=ctx.key_name(spec.key_name),
                instance_profile=profile, user_data=user_data, attempt=number,
                store_tag=nodes.store_tag, efa=efa,
                placement_group=ctx.placement_group() if efa else None)

        result = failover(candidates(), plan_for, nodes.launcher, cfg.max_launch_attempts,
                          fresh, attempts)
        if result.launched is not None:
            chosen, plan, raws = result.launched
            region = chosen.offer.region
            nodes.task_regions[task_id] = (region,)
            nodes.grant_replacements(task_id, plan)  # pinned to where the gang landed
            nodes.volumes.attach_blocks(chosen.ctx, spec, task_id, raws)
            note = _abort(nodes, task_id, {r: c for r, c in contexts.items() if r != region})
            if note:  # failed tries' regions: no leftovers
                warnings.warn(f"task {task_id} launched in {region};{note}", stacklevel=3)
            started = nodes.instances(task_id, raws)
            try:
                nodes.runtime.start(task_id, [(i.instance_id, i.address) for i in started],
                                    plan.user_data)
            except OSError as exc:
                terminate_task(nodes, task_id)
                raise ProviderError(f"could not start the nodes of task {task_id}: {exc}; "
                                    "nothing was left running") from exc
            return started
    except (ClientError, BotoCoreError, VolumeError) as exc:
        note = _abort(nodes, task_id, contexts)
        raise ProviderError(f"launch of task {task_id} failed: {exc}{note}") from exc
    except ProviderError as exc:
        note = _abort(nodes, task_id, contexts)
        if note:
            raise ProviderError(f"{exc}{note}") from exc
        raise
    note = _abort(nodes, task_id, contexts)
    capped = (f" (stopped at provider_config max_launch_attempts={cfg.max_launch_attempts})"
              if result.capped(cfg.max_launch_attempts) else "")
    raise CapacityError(
        f"could not launch {spec.num_instances} node(s) for task {task_id}: all "
        f"{len(attempts)} attempt(s) failed{capped}:\n{format_attempts(attempts)}\n"
        f"{note.strip() or 'Nothing was left running.'} Capacity comes and goes: retry "
        "later, allow more regions (provider_config regions=['us-east-1', 'us-west-2', "
        "...], and leave the task's region unset), use priority='med' to allow both spot "
        "and on-demand, or raise max_price_per_hour.")


def _abort(nodes: AwsNodes, task_id: str, contexts: Mapping[str, RegionContext]) -> str:
    """Terminate whatever the failed launch started and delete its per-task resources;
    returns a note for the error message when that cleanup itself failed."""
    problems = []
    for region, ctx in contexts.items():
        try:
            terminate_tagged(ctx.ec2, task_id)
            found = tagged_resources(ctx.ec2, task_id,
                                     placement_groups=nodes.task_efa.get(task_id, False))
            delete_resources(ctx.ec2, region, found)
        except (ClientError, BotoCoreError) as exc:
            problems.append(f"{region}: {exc}")
    if problems:
        return (" Cleaning up also failed (" + "; ".join(problems) + "); run `flow gc` "
                "to remove what is left.")
    return ""
