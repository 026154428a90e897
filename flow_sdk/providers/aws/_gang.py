"""Launching a task's gang: the catalog's offers, each in the zones that offer it, through the
one failover loop (``_launch.failover``); the task's volumes provisioned per attempt; the
runtime told to start the nodes.

Whatever ends a launch without a gang (every offer failed, an error, Ctrl-C, SIGTERM or SIGHUP)
rolls it back before it propagates: the instances it started, by the ids EC2 returned, by the
ClientToken of a request whose answer was lost and by the task tag (``LaunchLedger``); what the
node runtime runs for them; then the task's security groups, key pairs and placement groups in
every region it tried, its secret parameter and its node role. Signals wait until that is
done (``_interrupts``). The launch lease (``_lease``) tells ``flow gc`` about a client killed
mid-launch, which cannot roll back.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from flow_sdk.catalog import Offer
from flow_sdk.errors import CapacityError, ProviderError, VolumeError
from flow_sdk.providers.aws import _interrupts, _userdata
from flow_sdk.providers.aws._interrupts import LaunchInterrupted
from flow_sdk.providers.aws._launch import (
    Attempt,
    AttemptPlan,
    Failover,
    Try,
    failover,
    format_attempts,
)
from flow_sdk.providers.aws._lease import LeaseKeeper
from flow_sdk.providers.aws._nodes import AwsNodes
from flow_sdk.providers.aws._resources import (
    RegionContext,
    caller_cidr,
    delete_resources,
    tagged_resources,
)
from flow_sdk.providers.aws._rollback import ALIVE_STATES, LaunchLedger
from flow_sdk.providers.aws._runtime import NodeBoot
from flow_sdk.providers.base import Instance, LaunchRequest
from flow_sdk.providers.launch import node_launch
from flow_sdk.spec import TaskSpec

TERMINATED_WAIT_S = 300.0  # how long a rollback waits for its instances to release their groups
_POLL_S = 2.0


def launch(nodes: AwsNodes, request: LaunchRequest, offers: list[Offer]) -> list[Instance]:
    """Start the task's nodes as one gang (trying ``offers`` in order), or none: see the
    module docstring for what a launch that ends early removes."""
    task_id = request.task_id
    contexts: dict[str, RegionContext] = {}
    ledger = LaunchLedger()
    lease: LeaseKeeper | None = None
    try:
        with _interrupts.raising():
            lease = LeaseKeeper(nodes.store, task_id,  # before anything of the task exists
                                request.boot.secret)
            result = _start_gang(nodes, request, offers, contexts, ledger)
            if isinstance(result, list):
                lease.end("launched")
                return result
            failed = result
    except BaseException as exc:
        note, arrived = _roll_back(nodes, task_id, contexts, ledger, lease)
        if not isinstance(exc, (KeyboardInterrupt, LaunchInterrupted)):
            _interrupts.deliver(arrived)
        if isinstance(exc, (ClientError, BotoCoreError, VolumeError)):
            raise ProviderError(f"launch of task {task_id} failed: {exc}{note}") from exc
        if note and isinstance(exc, ProviderError):
            raise ProviderError(f"{exc}{note}") from exc
        if note:
            exc.add_note(note.strip())
        raise
    note, arrived = _roll_back(nodes, task_id, contexts, ledger, lease)
    _interrupts.deliver(arrived)
    spec, cfg = request.spec, nodes.cfg
    capped = (f" (stopped at provider_config max_launch_attempts={cfg.max_launch_attempts})"
              if failed.capped(cfg.max_launch_attempts) else "")
    raise CapacityError(
        f"could not launch {spec.num_instances} node(s) for task {task_id}: all "
        f"{len(failed.attempts)} attempt(s) failed{capped}:\n"
        f"{format_attempts(failed.attempts)}\n"
        f"{note.strip() or 'Nothing was left running.'} Capacity comes and goes: retry "
        "later, allow more regions (provider_config regions=['us-east-1', 'us-west-2', "
        "...], and leave the task's region unset), use priority='med' to allow both spot "
        "and on-demand, or raise max_price_per_hour.")


def _start_gang(nodes: AwsNodes, request: LaunchRequest, offers: list[Offer],
                contexts: dict[str, RegionContext], ledger: LaunchLedger
                ) -> list[Instance] | Failover:
    """The started nodes, or the failover's record when no offer gave a gang. Every region
    it touches is added to ``contexts``, every request and answer to ``ledger``."""
    spec, task_id, cfg = request.spec, request.task_id, nodes.cfg
    efa = _userdata.interconnect_of(spec.internode_interconnect) == "efa"
    nodes.task_efa[task_id] = efa
    attempts: list[Attempt] = []
    code = nodes.ship_code()  # the caller's SDK wheel, in the store before any node
    launch = node_launch(request, (code,))
    profile, fresh = nodes.task_access_for(task_id, spec, code, request.boot.secret)  # SSM
    ssh_cidr = caller_cidr(cfg)
    block_names = sorted(v.name for v in spec.volumes.values() if v.interface == "block")
    boots: dict[int, NodeBoot] = {}  # by attempt number: what the chosen attempt's nodes boot

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
        subnet_id, security_group = ctx.subnets()[candidate.zone], ctx.security_group(ssh_cidr)
        mounts_sh = nodes.volumes.provision(ctx, spec, candidate.zone, subnet_id,
                                            security_group)
        boot = boots[number] = nodes.render_user_data(
            launch, spec, task_id, candidate.offer.region, number, volume_mounts=mounts_sh)
        return AttemptPlan(
            task_id=task_id, spec=spec, offer=candidate.offer, zone=candidate.zone,
            subnet_id=subnet_id, security_group=security_group, ami_id=ctx.ami_id(),
            root_device=ctx.root_device(), key_name=ctx.key_name(spec.key_name),
            instance_profile=profile, user_data=boot.user_data, attempt=number,
            store_tag=nodes.store_tag, efa=efa,
            placement_group=ctx.placement_group() if efa else None)

    result = failover(candidates(), plan_for, nodes.launcher, cfg.max_launch_attempts, fresh,
                      attempts, ledger)
    if result.launched is None:
        return result
    chosen, plan, raws = result.launched
    return _land(nodes, task_id, spec, contexts, ledger, chosen, plan, raws, boots[plan.attempt])


def _land(nodes: AwsNodes, task_id: str, spec: TaskSpec, contexts: dict[str, RegionContext],
          ledger: LaunchLedger, chosen: Try, plan: AttemptPlan, raws: list[dict[str, Any]],
          boot: NodeBoot) -> list[Instance]:
    """Once a gang has landed: pin the task to its region, grant replacements, attach block
    volumes, clean up the failed tries' regions, and start the nodes through the runtime."""
    region = chosen.offer.region
    nodes.task_regions[task_id] = (region,)
    nodes.grant_replacements(task_id, plan)  # pinned to where the gang landed
    nodes.volumes.attach_blocks(chosen.ctx, spec, task_id, raws)
    others = {r: c for r, c in contexts.items() if r != region}
    note = _abort(nodes, task_id, others, ledger, whole_launch=False)
    if note:  # failed tries' regions: no leftovers
        warnings.warn(f"task {task_id} launched in {region};{note}", stacklevel=5)
    started = nodes.instances(task_id, raws)
    try:
        nodes.runtime.start(boot, [(i.instance_id, i.address) for i in started])
    except OSError as exc:
        raise ProviderError(f"could not start the nodes of task {task_id}: {exc}; nothing "
                            "was left running") from exc
    return started


def _roll_back(nodes: AwsNodes, task_id: str, contexts: Mapping[str, RegionContext],
               ledger: LaunchLedger, lease: LeaseKeeper | None) -> tuple[str, list[int]]:
    """Remove what the launch started, with signals held; returns a note for the error
    message when that itself failed, and the signals that arrived meanwhile."""
    with _interrupts.held() as arrived:
        note = _abort(nodes, task_id, contexts, ledger)
        try:  # the task's secret parameter and node role (with its grants) go too
            nodes.delete_task_access(task_id)
        except ProviderError as exc:
            note += (f" (The task's secret parameter or node role was not deleted: {exc}; "
                     "run `flow gc`.)")
        try:
            if lease is not None:
                lease.end("rolled-back")
        except (ProviderError, BotoCoreError) as exc:  # the lease goes stale instead
            note += f" (The launch lease could not be closed: {exc}.)"
    return note, list(arrived)


def _abort(nodes: AwsNodes, task_id: str, contexts: Mapping[str, RegionContext],
           ledger: LaunchLedger, *, whole_launch: bool = True) -> str:
    """Terminate whatever the launch started in ``contexts``' regions and delete the task's
    per-task resources there; returns a note for the error message when that cleanup itself
    failed. For the ``whole_launch`` it also stops what the node runtime runs for the task,
    and waits for terminated instances to let go of the groups they held (a launch that
    succeeded elsewhere leaves those to ``flow gc`` rather than wait)."""
    problems = []
    if whole_launch:
        try:
            nodes.runtime.stop(task_id)
        except OSError as exc:
            problems.append(f"node processes: {exc}")
    for region, ctx in contexts.items():
        try:
            ec2 = ctx.ec2
            terminated = ledger.roll_back(ec2, region, task_id, nodes.launcher.retry_base_s)
            found = tagged_resources(ec2, task_id,
                                     placement_groups=nodes.task_efa.get(task_id, False))
            done = delete_resources(ec2, region, found)
            if whole_launch and done.deferred and terminated:  # held by instances shutting down
                _await_terminated(ec2, terminated)
                done = delete_resources(ec2, region, tagged_resources(
                    ec2, task_id, placement_groups=nodes.task_efa.get(task_id, False)))
            problems.extend(done.deferred)
        except (ClientError, BotoCoreError) as exc:
            problems.append(f"{region}: {exc}")
    if problems:
        return (" Cleaning up also failed (" + "; ".join(problems) + "); run `flow gc` "
                "to remove what is left.")
    return ""


def _await_terminated(ec2: Any, instance_ids: list[str]) -> None:
    """Return once none of ``instance_ids`` is alive, or after ``TERMINATED_WAIT_S``."""
    deadline = time.monotonic() + TERMINATED_WAIT_S
    while time.monotonic() < deadline:
        alive = []
        for start in range(0, len(instance_ids), 200):
            for page in ec2.get_paginator("describe_instances").paginate(Filters=[
                    {"Name": "instance-id", "Values": instance_ids[start:start + 200]},
                    {"Name": "instance-state-name", "Values": ALIVE_STATES + ["shutting-down"]}]):
                alive += [i["InstanceId"] for r in page["Reservations"] for i in r["Instances"]]
        if not alive:
            return
        time.sleep(_POLL_S)
