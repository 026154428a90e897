"""Replacing lost nodes (``max_restarts``), called from the deciding node agent.

Each replacement is a copy of a running node of the gang (its image, security group, key
pair, instance profile, placement group), with the gang's tags (its attempt tag, so the
running nodes discover it; the node role) plus a replacement tag, and the gang's user-data
(its runtime cap shortened to what is left of the task's). Tried in order, through the same
failover loop as the gang (``_launch.failover``): the gang's offer in the gang's zone; the
priority's other market there, within ``max_price_per_hour``; then, unless EFA ties the gang
to its placement group, the same offers in the region's other zones. A failed try is rolled
back by its own replacement tag: the running nodes are never touched.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Mapping
from typing import Any

from flow_sdk import wire
from flow_sdk.catalog import MARKETS, Market, Offer, load_catalog, markets_for_priority
from flow_sdk.errors import CapacityError, ProviderError, RecordError, SignatureError
from flow_sdk.wire import TaskRecord, signing
from flow_sdk.providers.aws import _userdata
from flow_sdk.providers.aws._launch import AttemptPlan, Try, failover, format_attempts
from flow_sdk.providers.aws._iam import role_name
from flow_sdk.providers.aws._nodes import AwsNodes
from flow_sdk.providers.aws._resources import (
    TAG_ATTEMPT,
    TAG_PRICE,
    RegionContext,
    resource_name,
    tag_value,
)
from flow_sdk.providers.aws._teardown import terminate_instances
from flow_sdk.providers.base import Instance, LaunchRequest
from flow_sdk.providers.launch import node_launch
from flow_sdk.spec import TaskSpec


def add_instances(nodes: AwsNodes, request: LaunchRequest, count: int) -> list[Instance]:
    """Start ``count`` nodes that join the task's running gang (see the module docstring)."""
    task_id, spec = request.task_id, request.spec
    region, template, profile = _template(nodes, task_id)
    attempt = int(str(tag_value(template, TAG_ATTEMPT)))
    gang_subnet, security_group = network_of(template)
    hours = _remaining_hours(nodes, request, spec)
    launch = node_launch(request, (nodes.ship_code(),), max_run_time_hours=hours)
    boot = nodes.render_user_data(launch, spec, task_id, region, attempt,
                                  volume_mounts=nodes.volumes.remount(task_id, spec, region))
    efa = _userdata.interconnect_of(spec.internode_interconnect) == "efa"
    zone = str(template["Placement"]["AvailabilityZone"])
    offers = _replacement_offers(spec, template, region)
    ctx = RegionContext(nodes.clients, nodes.cfg, region, task_id, nodes.store_tag)

    def candidates() -> Iterator[Try]:  # one region: a quota error ends the search
        for offer in offers:
            yield Try(offer, zone, ctx, group=region, subnet_id=gang_subnet)
        if efa or spec.volumes:
            return  # the placement group, or the EFS mount target, is in this zone only
        subnets = ctx.subnets()
        for other in ctx.zones_for(offers[0].instance_type):
            if other != zone:
                for offer in offers:
                    yield Try(offer, other, ctx, group=region, subnet_id=subnets[other])

    batch = secrets.token_hex(4)

    def plan_for(number: int, candidate: Try) -> AttemptPlan:
        return AttemptPlan(
            task_id=task_id, spec=spec, offer=candidate.offer, zone=candidate.zone,
            subnet_id=str(candidate.subnet_id), security_group=security_group,
            ami_id=str(template["ImageId"]),
            root_device=str(template.get("RootDeviceName") or "/dev/sda1"),
            key_name=template.get("KeyName"), instance_profile=str(profile),
            user_data=boot.user_data, attempt=attempt, store_tag=nodes.store_tag, efa=efa,
            placement_group=resource_name(task_id) if efa else None, count=count,
            replacement=f"{batch}-{number}")

    result = failover(candidates(), plan_for, nodes.launcher, nodes.cfg.max_launch_attempts,
                      False)
    if result.launched is None:
        raise CapacityError(
            f"could not start {count} replacement node(s) for task {task_id}: all "
            f"{len(result.attempts)} attempt(s) failed:\n{format_attempts(result.attempts)}\n"
            "Nothing was left running, and the running nodes were not touched.")
    started = nodes.instances(task_id, result.launched[2])
    try:
        nodes.runtime.start(boot, [(i.instance_id, i.address) for i in started])
    except OSError as exc:
        terminate_instances(nodes, task_id, [i.instance_id for i in started])
        raise ProviderError(f"could not start the replacement nodes of task {task_id}: "
                            f"{exc}; they were terminated") from exc
    return started


def _template(nodes: AwsNodes, task_id: str) -> tuple[str, dict[str, Any], str]:
    """(region, instance, instance profile) of the running node of the gang that
    replacements copy. A gang is launched with one instance profile: the one a running node
    reports, else the task's own by name (an API may report the association on some
    instances of a request only, and the one that does may be the lost node)."""
    alive = sorted(nodes.describe_in_regions(task_id, ["pending", "running"]),
                   key=lambda pair: str(pair[1]["InstanceId"]))
    if not alive:
        raise ProviderError(f"task {task_id} has no running node to copy, so lost nodes "
                            "cannot be replaced; launch the task again")
    copyable = [(region, raw) for region, raw in alive
                if tag_value(raw, TAG_ATTEMPT) is not None and network_of(raw)[1]]
    reported = (str(arn) for _, raw in alive
                if (arn := (raw.get("IamInstanceProfile") or {}).get("Arn")))
    profile = next(reported, None) or nodes.cfg.instance_profile or role_name(
        nodes.store_tag, task_id)
    if not copyable:
        raise ProviderError(f"no running node of task {task_id} carries an attempt tag "
                            "and a security group; they were not launched by flow-sdk's aws "
                            "provider, so none can be copied")
    region, raw = copyable[0]
    return region, raw, profile


def network_of(raw: Mapping[str, Any]) -> tuple[str, str]:
    """(subnet, security group) of an instance: its own, or its primary interface's (an EFA
    node's live on its network interfaces). Empty strings when it reports none."""
    nics = sorted(raw.get("NetworkInterfaces") or [],
                  key=lambda n: (n.get("Attachment") or {}).get("DeviceIndex", 0))
    primary = nics[0] if nics else {}
    subnet = raw.get("SubnetId") or primary.get("SubnetId") or ""
    groups = raw.get("SecurityGroups") or primary.get("Groups") or []
    return str(subnet), str(groups[0]["GroupId"]) if groups else ""


def _remaining_hours(nodes: AwsNodes, request: LaunchRequest, spec: TaskSpec) -> float | None:
    """What is left of the task's runtime cap (replacements must not outlive it), counted
    from the task record sealed with the task's secret; the whole cap when there is none (a
    record a store writer forged or removed never ends a task here)."""
    cap = spec.max_run_time_hours
    if cap is None:
        return None
    task_id = request.task_id
    store = signing.SignedStore(nodes.store, signing.secret_from_hex(request.boot.secret))
    try:
        raw = store.get_record(wire.task_key(task_id))
        record = None if raw is None else TaskRecord.from_json(raw)
    except (SignatureError, RecordError):
        record = None
    if record is None:
        return cap
    left = cap - (time.time() - record.created_at) / 3600.0
    if left <= 0:
        raise ProviderError(f"task {task_id} is past its max_run_time_hours of {cap:g}; "
                            "no replacement node was started")
    return left


def _replacement_offers(spec: TaskSpec, template: Mapping[str, Any], region: str
                        ) -> list[Offer]:
    """The gang's own offer (at the price it was launched at), then the priority's other
    markets for the same type in the same region, within the price cap."""
    name = str(template["InstanceType"])
    catalog = load_catalog()
    try:
        hardware = catalog.instance_type(name)
    except KeyError as exc:
        raise ProviderError(f"cannot replace a {name} node: {exc.args[0]}") from None
    prices: dict[Market, float | None] = {m: None for m in MARKETS}
    for entry in catalog.entries:
        if entry.instance.name == name and entry.region == region:
            prices = {m: entry.price(m) for m in MARKETS}
    market: Market = "spot" if template.get("InstanceLifecycle") == "spot" else "on-demand"
    launched_at = tag_value(dict(template), TAG_PRICE)
    own = float(launched_at) if launched_at else prices[market]
    offers = [Offer(hardware, region, market, own or 0.0)]
    for other in markets_for_priority(spec.priority):
        price = prices[other]
        if other == market or price is None:
            continue
        if spec.max_price_per_hour is None or price <= spec.max_price_per_hour:
            offers.append(Offer(hardware, region, other, price))
    return offers
