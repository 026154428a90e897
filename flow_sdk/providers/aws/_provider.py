"""``AwsProvider``: EC2 nodes, an S3 object store, CloudWatch Logs, and ``gc``."""

from __future__ import annotations

import base64
import json
import re
import secrets
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from flow_sdk import protocol
from flow_sdk.catalog import (
    MARKETS,
    CatalogError,
    Market,
    Offer,
    OfferNotFoundError,
    UnknownRegionError,
    load_catalog,
    markets_for_priority,
    plan_offers,
)
from flow_sdk.errors import CapacityError, FieldProblem, ProviderError
from flow_sdk.protocol import TaskRecord
from flow_sdk.providers.aws import _gc, _hostkeys, _userdata
from flow_sdk.providers.aws._clients import Clients, error_code, error_message
from flow_sdk.providers.aws._config import IMDS_ENDPOINT, AwsConfig
from flow_sdk.providers.aws._cwlogs import CloudWatchLogStore
from flow_sdk.providers.aws._imds import SPOT_ACTION_PATH, ImdsClient
from flow_sdk.providers.aws._launch import (
    Attempt,
    AttemptFailed,
    AttemptPlan,
    GangLauncher,
    format_attempts,
    terminate_tagged,
)
from flow_sdk.providers.aws._resources import (
    TAG_ATTEMPT,
    TAG_PRICE,
    TAG_TASK,
    Cleanup,
    RegionContext,
    caller_cidr,
    delete_resources,
    ensure_instance_profile,
    key_path,
    resource_name,
    tag_value,
    tagged_resources,
)
from flow_sdk.providers.aws._s3store import S3ObjectStore
from flow_sdk.providers.aws._simulate import (
    SimulatedNodes,
    free_ports,
    simulated_address,
)
from flow_sdk.providers.base import (
    Instance,
    InstanceState,
    LaunchPlan,
    LaunchRequest,
    LogStore,
    ObjectStore,
    Provider,
    SshEndpoint,
)
from flow_sdk.spec import TaskSpec
from flow_sdk.volumes import ebs as flow_ebs
from flow_sdk.volumes import efs as flow_efs
from flow_sdk.volumes.errors import VolumeError

_STATES: dict[str, InstanceState] = {"pending": "pending", "running": "running"}
_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
_SAMPLE_TASK_ID = "t" * 64  # longer than any task id: check() sizes the user-data with it


@dataclass(frozen=True)
class InstanceDetail:
    """One EC2 instance of a task, as ``describe`` reports it."""

    instance_id: str
    instance_type: str
    zone: str
    market: str
    state: str
    address: str
    public_ip: str | None
    attempt: str | None
    launched_at: float


class AwsProvider(Provider):
    """EC2 through boto3. See the package docstring for what each part does."""

    name: ClassVar[str] = "aws"

    def __init__(self, config: AwsConfig, *, session: boto3.session.Session | None = None
                 ) -> None:
        self.cfg = config
        self.clients = Clients(config.endpoint_url, session)
        self._bucket = config.bucket
        self._lock = threading.Lock()
        is_node = config.launch is not None
        self._store = S3ObjectStore(lambda: self.clients.get("s3", config.region),
                                    self.bucket_name, config.prefix, config.region,
                                    create_bucket=not is_node)
        self._logs = CloudWatchLogStore(lambda: self.clients.get("logs", config.region),
                                        config.log_group_prefix, config.log_retention_days)
        self._task_regions: dict[str, tuple[str, ...]] = {}
        self._task_efa: dict[str, bool] = {}
        self._profile: tuple[str, bool] | None = None
        self._imds: dict[str, ImdsClient] = {}
        self.launcher = GangLauncher()
        self.simulation = (SimulatedNodes(Path(config.simulate.root))
                           if config.simulate is not None else None)

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *,
                    session: boto3.session.Session | None = None) -> AwsProvider:
        """Rebuild from ``config()`` output or a user's provider_config. ``session`` (a boto3
        Session, e.g. with event hooks) is for tests and benchmarks; it is never serialized."""
        return cls(AwsConfig.from_mapping(config), session=session)

    def config(self) -> dict[str, Any]:
        data = self.cfg.to_dict()
        data["bucket"] = self.bucket_name()
        return data

    def bucket_name(self) -> str:
        """The bucket; by default ``flow-sdk-<account id>-<region>`` (one STS call, once)."""
        if self._bucket is None:
            with self._lock:
                if self._bucket is None:
                    try:
                        account = self.clients.get("sts", self.cfg.region).get_caller_identity()
                    except (ClientError, BotoCoreError) as exc:
                        raise ProviderError(
                            f"could not identify the AWS account for the default bucket ({exc})"
                            "; configure AWS credentials, or set provider_config bucket") from exc
                    self._bucket = f"flow-sdk-{account['Account']}-{self.cfg.region}"
        return self._bucket

    @property
    def store_tag(self) -> str:
        """Tagged on every resource this provider creates; ``gc`` touches only its own."""
        return f"s3://{self.bucket_name()}/{self.cfg.prefix}"

    @property
    def store(self) -> ObjectStore:
        return self._store

    @property
    def logs(self) -> LogStore:
        return self._logs

    # -- checks and plans -------------------------------------------------------------------

    def _plan(self, spec: TaskSpec) -> list[Offer]:
        """The offers to try, in order (an InfiniBand ask is served by EFA: see plan_offers)."""
        return plan_offers(spec, regions=list(self.cfg.launch_regions))

    def check(self, spec: TaskSpec) -> list[FieldProblem]:
        """Everything about ``spec`` that can be found wrong before anything is created: an
        offer within the price cap, priority and interconnect (the error lists the cheapest
        offers), volumes, the image reference, and the user-data size."""
        problems = []
        try:
            self._plan(spec)
        except (UnknownRegionError, OfferNotFoundError, CatalogError) as exc:
            problems.append(FieldProblem(exc.field, str(exc)))
        if self.simulation is not None:
            for field, given in (("volumes", spec.volumes), ("mounts", spec.mounts)):
                if given:
                    problems.append(FieldProblem(
                        field, f"the simulated aws cloud runs no node bootstrap, so it cannot "
                        f"mount {field} (EFS, EBS and S3 mounts need real EC2 nodes); remove "
                        f"{field}, or use the local provider, which supports them"))
        if spec.image is not None and not _IMAGE_RE.match(spec.image):
            problems.append(FieldProblem(
                "image", f"{spec.image!r} is not a container image reference such as "
                "'nvcr.io/nvidia/pytorch:24.05-py3'"))
        else:
            try:
                volume_mounts = _sample_volume_mounts(spec)
                self._render_user_data(spec, _SAMPLE_TASK_ID, self.cfg.region,
                                       self.cfg.max_launch_attempts,
                                       {"FLOW_BOOT": json.dumps({"task_id": _SAMPLE_TASK_ID,
                                                                 "provider": self.name})},
                                       spec.max_run_time_hours, bucket=self._bucket or "b" * 63,
                                       volume_mounts=volume_mounts)
            except VolumeError as exc:
                problems.append(FieldProblem("volumes", str(exc)))
            except ProviderError as exc:
                problems.append(FieldProblem("image" if spec.image else "provider_config",
                                             str(exc)))
        return problems

    def _render_user_data(self, spec: TaskSpec, task_id: str, region: str, attempt: int,
                          boot_env: Mapping[str, str], max_run_time_hours: float | None,
                          *, bucket: str | None = None, volume_mounts: str = "") -> str:
        """The user-data of one gang's nodes (and of their replacements); ``volume_mounts``
        are the bash lines that mount the task's volumes (efs/ebs ``mount_script``)."""
        node_config = self.cfg.for_node(task_id, region, attempt).to_dict()
        node_config["bucket"] = bucket if bucket is not None else self.bucket_name()
        boot_json = _userdata.node_boot_env(boot_env, node_config)
        return _userdata.render_for(
            boot_json, self.cfg.agent_pip, spec.image, spec.gpu is not None,
            spec.internode_interconnect, _userdata.mount_paths(spec.volumes, spec.mounts),
            max_run_time_hours, volume_mounts)

    def plan(self, spec: TaskSpec) -> LaunchPlan:
        """The offer ``launch`` tries first (its first zone is chosen at launch), and how many
        more the failover would try."""
        try:
            offers = self._plan(spec)
        except (OfferNotFoundError, UnknownRegionError, CatalogError) as exc:
            raise ProviderError(f"no AWS offer for this task: {exc}") from exc
        first = offers[0]
        return LaunchPlan(self.name, first.instance_type, first.region, first.market,
                          first.usd_per_hour, spec.num_instances, spec.max_run_time_hours,
                          alternatives=len(offers) - 1)

    def rendezvous_ports(self) -> tuple[int, int]:
        if self.simulation is not None:
            return free_ports()  # simulated nodes share this machine's port space
        return super().rendezvous_ports()

    def _instance_profile(self, mounts: Sequence[str] = ()) -> tuple[str, bool]:
        """The nodes' instance profile; a task's S3 mounts add read grants to its policy."""
        if self._profile is None or mounts:
            name, fresh = ensure_instance_profile(self.clients, self.cfg, self.bucket_name(),
                                                  self.store_tag, mounts)
            fresh = fresh or (self._profile is not None and self._profile[1])
            self._profile = (name, fresh)
        return self._profile

    # -- launch -----------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> list[Instance]:
        spec = request.spec
        task_id = request.task_id
        try:
            offers = self._plan(spec)
        except (OfferNotFoundError, UnknownRegionError, CatalogError) as exc:
            raise ProviderError(f"no AWS offer for task {task_id}: {exc}") from exc
        efa = _userdata.interconnect_of(spec.internode_interconnect) == "efa"
        self._task_efa[task_id] = efa
        contexts: dict[str, RegionContext] = {}
        attempts: list[Attempt] = []
        number = 0
        try:
            profile, fresh = self._instance_profile(sorted(spec.mounts.values()))
            ssh_cidr = caller_cidr(self.cfg)
            block_names = sorted(v.name for v in spec.volumes.values() if v.interface == "block")
            for offer in offers:
                if number >= self.cfg.max_launch_attempts:
                    break
                ctx = contexts.get(offer.region)
                if ctx is None:
                    ctx = contexts[offer.region] = RegionContext(
                        self.clients, self.cfg, offer.region, task_id, self.store_tag)
                zones = ctx.zones_for(offer.instance_type)
                pinned = self._block_zone(ctx, task_id, block_names)
                if pinned is not None:
                    zones = [z for z in zones if z == pinned]
                if not zones:
                    where = (f"the block volumes' zone {pinned}" if pinned is not None
                             else "no availability zone")
                    attempts.append(Attempt(None, offer, None, "NotOffered", f"{where} with a "
                                            "default subnet offers this type"))
                    continue
                for zone in zones:
                    if number >= self.cfg.max_launch_attempts:
                        break
                    if pinned is None and block_names:  # an earlier try created them
                        pinned = self._block_zone(ctx, task_id, block_names)
                        if pinned not in (None, zone):
                            break
                    number += 1
                    plan = self._attempt_plan(ctx, request, offer, zone, number, efa,
                                              profile, ssh_cidr)
                    try:
                        instances = self.launcher.try_launch(ctx, plan, fresh)
                    except AttemptFailed as failed:
                        attempts.append(Attempt(number, offer, zone, failed.code,
                                                failed.message))
                        if failed.skip_region:
                            break
                        continue
                    self._task_regions[task_id] = (offer.region,)
                    self._attach_block_volumes(ctx, plan, instances)
                    others = {r: c for r, c in contexts.items() if r != offer.region}
                    note = self._abort(task_id, others)  # failed tries' regions: no leftovers
                    if note:
                        warnings.warn(f"task {task_id} launched in {offer.region};{note}",
                                      stacklevel=2)
                    return self._started(request, ctx, instances)
        except (ClientError, BotoCoreError, VolumeError) as exc:
            note = self._abort(task_id, contexts)
            raise ProviderError(f"launch of task {task_id} failed: {exc}{note}") from exc
        except ProviderError as exc:
            note = self._abort(task_id, contexts)
            if note:
                raise ProviderError(f"{exc}{note}") from exc
            raise
        note = self._abort(task_id, contexts)
        capped = (f" (stopped at provider_config max_launch_attempts="
                  f"{self.cfg.max_launch_attempts})" if number >= self.cfg.max_launch_attempts
                  else "")
        raise CapacityError(
            f"could not launch {spec.num_instances} node(s) for task {task_id}: all "
            f"{len(attempts)} attempt(s) failed{capped}:\n{format_attempts(attempts)}\n"
            f"{note.strip() or 'Nothing was left running.'} Capacity comes and goes: retry "
            "later, allow more regions (provider_config regions=['us-east-1', 'us-west-2', "
            "...], and leave the task's region unset), use priority='med' to allow both spot "
            "and on-demand, or raise max_price_per_hour.")

    def _attempt_plan(self, ctx: RegionContext, request: LaunchRequest, offer: Offer, zone: str,
                      number: int, efa: bool, profile: str, ssh_cidr: str) -> AttemptPlan:
        spec = request.spec
        subnet_id, security_group = ctx.subnets()[zone], ctx.security_group(ssh_cidr)
        mounts_sh = self._provision_volumes(ctx, spec, zone, subnet_id, security_group)
        user_data = self._render_user_data(spec, request.task_id, offer.region, number,
                                           request.boot_env, spec.max_run_time_hours,
                                           volume_mounts=mounts_sh)
        return AttemptPlan(
            task_id=request.task_id, spec=spec, offer=offer, zone=zone,
            subnet_id=subnet_id, security_group=security_group,
            ami_id=ctx.ami_id(), root_device=ctx.root_device(),
            key_name=ctx.key_name(spec.key_name), instance_profile=profile,
            user_data=user_data, attempt=number, store_tag=self.store_tag, efa=efa,
            placement_group=ctx.placement_group() if efa else None)

    @staticmethod
    def _block_zone(ctx: RegionContext, task_id: str, names: list[str]) -> str | None:
        """The zone the task's existing block volumes live in (the node must launch there),
        None when none exists yet in this region."""
        zones = {flow_ebs.block_volume_zone(ctx.ec2, name) for name in names} - {None}
        if len(zones) > 1:
            raise ProviderError(f"the block volumes {names} of task {task_id} live in "
                                f"different zones ({sorted(map(str, zones))}) of {ctx.region}; "
                                "one node can attach them only in one zone")
        return str(zones.pop()) if zones else None

    def _provision_volumes(self, ctx: RegionContext, spec: TaskSpec, zone: str, subnet_id: str,
                           security_group: str) -> str:
        """Before an attempt: the task's EFS file systems (found or created) with a mount
        target in ``subnet_id`` open to the nodes' group, and its EBS volumes (found or
        created in ``zone``). Returns the user-data lines that mount them (the block volumes
        are attached once the node exists: ``_attach_block_volumes``)."""
        if not spec.volumes:
            return ""
        mounts_sh = flow_efs.provision_file_volumes(
            self.clients.get("efs", ctx.region), ctx.ec2, spec.volumes, subnet_ids=[subnet_id],
            node_security_group=security_group)
        blocks = {path: flow_ebs.ensure_block_volume(ctx.ec2, volume, zone)
                  for path, volume in spec.volumes.items() if volume.interface == "block"}
        return mounts_sh + flow_ebs.mount_script(blocks)

    def _attach_block_volumes(self, ctx: RegionContext, plan: AttemptPlan,
                              instances: list[dict[str, Any]]) -> None:
        """Attach the task's block volumes to its (single) node, at the devices the user-data
        waits for (``flow_ebs.DEVICES`` in sorted path order)."""
        blocks = {p: v for p, v in plan.spec.volumes.items() if v.interface == "block"}
        if not blocks:
            return
        if len(instances) != 1:
            raise ProviderError(f"block volumes attach to one node, but task {plan.task_id} "
                                f"started {len(instances)}")
        instance_id = str(instances[0]["InstanceId"])
        for device, (path, volume) in zip(flow_ebs.DEVICES, sorted(blocks.items())):
            found = flow_ebs.find_block_volume(ctx.ec2, volume.name)
            if found is None:
                raise ProviderError(f"block volume {volume.name!r} for {path} vanished before "
                                    f"it could be attached to {instance_id}")
            flow_ebs.attach_block_volume(ctx.ec2, found.volume_id, instance_id, device)

    def _started(self, request: LaunchRequest, ctx: RegionContext,
                 instances: list[dict[str, Any]]) -> list[Instance]:
        started = sorted((self._instance(request.task_id, i) for i in instances),
                         key=lambda i: i.instance_id)
        try:
            self._play(request.task_id, ctx, started)
        except OSError as exc:
            self.terminate(request.task_id)
            raise ProviderError(f"could not start the simulated nodes of task "
                                f"{request.task_id}: {exc}; nothing was left running") from exc
        return started

    def _play(self, task_id: str, ctx: RegionContext, started: list[Instance]) -> None:
        """Simulated cloud only: each instance is played by a local agent that boots with what
        the user-data moto recorded would give it (FLOW_BOOT), its instance id and address."""
        if self.simulation is None:
            return
        recorded = ctx.ec2.describe_instance_attribute(
            InstanceId=started[0].instance_id, Attribute="userData")
        script = base64.b64decode(recorded["UserData"]["Value"]).decode("utf-8")
        boot = {"FLOW_BOOT": _userdata.boot_json_from_user_data(script)}
        self.simulation.start(task_id, [(i.instance_id, i.address) for i in started], boot)

    def _abort(self, task_id: str, contexts: Mapping[str, RegionContext]) -> str:
        """Terminate whatever the failed launch started and delete its per-task resources;
        returns a note for the error message when that cleanup itself failed."""
        problems = []
        for region, ctx in contexts.items():
            try:
                terminate_tagged(ctx.ec2, task_id)
                found = tagged_resources(ctx.ec2, task_id,
                                         placement_groups=self._task_efa.get(task_id, False))
                delete_resources(ctx.ec2, region, found)
            except (ClientError, BotoCoreError) as exc:
                problems.append(f"{region}: {exc}")
        if problems:
            return (" Cleaning up also failed (" + "; ".join(problems) + "); run `flow gc` "
                    "to remove what is left.")
        return ""

    # -- discovery --------------------------------------------------------------------------

    def _regions_for(self, task_id: str) -> tuple[str, ...]:
        launch = self.cfg.launch
        if launch is not None and launch.task_id == task_id:
            return (launch.region,)
        cached = self._task_regions.get(task_id)
        if cached is not None:
            return cached
        regions = self.cfg.launch_regions
        raw = self.store.get(protocol.task_key(task_id))
        if raw is not None:
            spec = TaskRecord.from_json(raw).spec
            if spec.get("region"):
                regions = (str(spec["region"]),)
            self._task_efa[task_id] = _userdata.interconnect_of(
                spec.get("internode_interconnect")) == "efa"
        self._task_regions[task_id] = regions
        return regions

    def _instance(self, task_id: str, raw: dict[str, Any]) -> Instance:
        address = str(raw.get("PrivateIpAddress") or "")
        if self.simulation is not None and address:
            address = simulated_address(address)
        state = _STATES.get(raw.get("State", {}).get("Name", ""), "terminated")
        price = tag_value(raw, TAG_PRICE)
        return Instance(
            str(raw["InstanceId"]), task_id, address, state, raw["LaunchTime"].timestamp(),
            usd_per_hour=float(price) if price else 0.0,
            market="spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand",
            instance_type=str(raw.get("InstanceType", "")),
            zone=raw.get("Placement", {}).get("AvailabilityZone"))

    def _describe_raw(self, task_id: str) -> list[dict[str, Any]]:
        """Every instance of the task: ONE paged describe_instances by task tag per region."""
        return [raw for _region, raw in self._describe_in_regions(task_id)]

    def _describe_in_regions(self, task_id: str, states: list[str] | None = None
                             ) -> list[tuple[str, dict[str, Any]]]:
        filters = [{"Name": f"tag:{TAG_TASK}", "Values": [task_id]}]
        launch = self.cfg.launch
        if launch is not None and launch.task_id == task_id:  # a node sees its own gang only
            filters.append({"Name": f"tag:{TAG_ATTEMPT}", "Values": [str(launch.attempt)]})
        if states is not None:
            filters.append({"Name": "instance-state-name", "Values": states})
        found: list[tuple[str, dict[str, Any]]] = []
        for region in self._regions_for(task_id):
            ec2 = self.clients.get("ec2", region)
            try:
                for page in ec2.get_paginator("describe_instances").paginate(
                        Filters=filters, PaginationConfig={"PageSize": 1000}):
                    found.extend((region, i) for r in page["Reservations"]
                                 for i in r["Instances"])
            except (ClientError, BotoCoreError) as exc:
                raise ProviderError(f"could not list the instances of task {task_id} in "
                                    f"{region}: {exc}") from exc
        return found

    def list_instances(self, task_id: str) -> list[Instance]:
        return sorted((self._instance(task_id, raw) for raw in self._describe_raw(task_id)),
                      key=lambda i: i.instance_id)

    def describe(self, task_id: str) -> list[InstanceDetail]:
        """The task's instances with type, zone, market and addresses, by instance id."""
        details = []
        for raw in self._describe_raw(task_id):
            base = self._instance(task_id, raw)
            details.append(InstanceDetail(
                instance_id=base.instance_id, instance_type=str(raw.get("InstanceType")),
                zone=str(raw.get("Placement", {}).get("AvailabilityZone")),
                market="spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand",
                state=str(raw.get("State", {}).get("Name")), address=base.address,
                public_ip=raw.get("PublicIpAddress"), attempt=tag_value(raw, TAG_ATTEMPT),
                launched_at=base.launched_at))
        return sorted(details, key=lambda d: d.instance_id)

    # -- ssh ------------------------------------------------------------------------------

    def ssh_endpoint(self, task_id: str, instance_id: str) -> SshEndpoint:
        """How to reach one node over SSH, its host key pinned: the ed25519 key the node's
        bootstrap printed to its serial console (``_hostkeys``), read with GetConsoleOutput.
        The address is the public or private IP (provider_config ``ssh_address``), the user
        ``ssh_user``, the key the per-task key pair written (0600) at launch, or
        ``ssh_key_path`` for a user-named key pair. Raises ProviderError saying why when the
        node cannot be reached yet (no host key published, no address) or at all."""
        if self.simulation is not None:
            raise ProviderError(f"node {instance_id} of task {task_id} is a simulated node (a "
                                "local agent process); the simulated aws cloud runs no sshd")
        found = [(region, raw) for region, raw in self._describe_in_regions(task_id)
                 if raw.get("InstanceId") == instance_id]
        if not found:
            raise ProviderError(f"task {task_id} has no node {instance_id}")
        region, raw = found[0]
        state = str(raw.get("State", {}).get("Name"))
        if state != "running":
            raise ProviderError(f"node {instance_id} of task {task_id} is {state}, not running")
        field = "PublicIpAddress" if self.cfg.ssh_address == "public" else "PrivateIpAddress"
        host = raw.get(field)
        if not host:
            raise ProviderError(f"node {instance_id} has no {self.cfg.ssh_address} IP address; "
                                "set provider_config ssh_address='private' to dial its VPC "
                                "address (through a VPN or bastion)")
        key_file = self._ssh_key_file(task_id, region, raw)
        try:
            console = self.clients.get("ec2", region).get_console_output(
                InstanceId=instance_id, Latest=True)
        except (ClientError, BotoCoreError) as exc:
            raise ProviderError(f"could not read the serial console of node {instance_id} for "
                                f"its SSH host key ({exc}); the caller needs "
                                "ec2:GetConsoleOutput") from exc
        host_key = _hostkeys.pinned_host_key(str(console.get("Output") or ""), instance_id)
        return SshEndpoint(host=str(host), port=22, user=self.cfg.ssh_user, host_key=host_key,
                           key_path=str(key_file))

    def _ssh_key_file(self, task_id: str, region: str, raw: Mapping[str, Any]) -> Path:
        key_name = raw.get("KeyName")
        if key_name == resource_name(task_id):
            path = key_path(task_id, region)
            if not path.exists():
                raise ProviderError(f"the private key of task {task_id} ({path}) is not on this "
                                    "machine; it is written only where the task was launched")
            return path
        if self.cfg.ssh_key_path is None:
            raise ProviderError(f"node {raw.get('InstanceId')} uses your key pair {key_name!r}; "
                                "set provider_config ssh_key_path to its private key file")
        return Path(self.cfg.ssh_key_path).expanduser()

    # -- replacing lost nodes (max_restarts), from the deciding node -------------------------

    def add_instances(self, request: LaunchRequest, count: int) -> list[Instance]:
        """Start ``count`` nodes that join the task's running gang.

        Each is a copy of a running node of the gang (its image, security group, key pair,
        instance profile, placement group), with the gang's tags (its attempt tag, so the
        running nodes discover it; the node role) plus a replacement tag, and the gang's
        user-data (its runtime cap shortened to what is left of the task's). Tried in order:
        the gang's offer in the gang's zone; the priority's other market there, within
        ``max_price_per_hour``; then, unless EFA ties the gang to its placement group, the
        same offers in the region's other zones. A failed try is rolled back by its own
        replacement tag: the running nodes are never touched.
        """
        task_id = request.task_id
        spec = request.spec
        if count < 1:
            raise ProviderError(f"add_instances needs a count of at least 1, got {count}")
        try:
            return self._add_instances(request, spec, count)
        except (ClientError, BotoCoreError) as exc:
            raise ProviderError(f"could not start replacement nodes for task {task_id}: {exc}"
                                ) from exc

    def _add_instances(self, request: LaunchRequest, spec: TaskSpec, count: int
                       ) -> list[Instance]:
        task_id = request.task_id
        alive = sorted(self._describe_in_regions(task_id, ["pending", "running"]),
                       key=lambda pair: str(pair[1]["InstanceId"]))
        if not alive:
            raise ProviderError(f"task {task_id} has no running node to copy, so lost nodes "
                                "cannot be replaced; launch the task again")
        copyable = [(region, raw) for region, raw in alive
                    if tag_value(raw, TAG_ATTEMPT) is not None and _network_of(raw)[1]
                    and (raw.get("IamInstanceProfile") or {}).get("Arn")]
        if not copyable:
            raise ProviderError(f"no running node of task {task_id} carries an attempt tag, "
                                "an instance profile and a security group; they were not "
                                "launched by flow-sdk's aws provider, so none can be copied")
        region, template = copyable[0]
        attempt = int(str(tag_value(template, TAG_ATTEMPT)))
        profile = template["IamInstanceProfile"]["Arn"]
        gang_subnet, security_group = _network_of(template)
        hours = self._remaining_hours(task_id, spec)
        user_data = self._render_user_data(spec, task_id, region, attempt, request.boot_env,
                                           hours, volume_mounts=self._remount(task_id, spec,
                                                                              region))
        efa = _userdata.interconnect_of(spec.internode_interconnect) == "efa"
        zone = str(template["Placement"]["AvailabilityZone"])
        offers = self._replacement_offers(spec, template, region)
        ctx = RegionContext(self.clients, self.cfg, region, task_id, self.store_tag)

        def tries() -> Iterator[tuple[Offer, str, str]]:
            for offer in offers:
                yield offer, zone, gang_subnet
            if efa or spec.volumes:
                return  # the placement group, or the EFS mount target, is in this zone only
            subnets = ctx.subnets()
            for other in ctx.zones_for(offers[0].instance_type):
                if other != zone:
                    for offer in offers:
                        yield offer, other, subnets[other]

        batch = secrets.token_hex(4)
        attempts: list[Attempt] = []
        number = 0
        for offer, where, subnet in tries():
            if number >= self.cfg.max_launch_attempts:
                break
            number += 1
            plan = AttemptPlan(
                task_id=task_id, spec=spec, offer=offer, zone=where, subnet_id=subnet,
                security_group=security_group, ami_id=str(template["ImageId"]),
                root_device=str(template.get("RootDeviceName") or "/dev/sda1"),
                key_name=template.get("KeyName"), instance_profile=str(profile),
                user_data=user_data, attempt=attempt, store_tag=self.store_tag, efa=efa,
                placement_group=resource_name(task_id) if efa else None, count=count,
                replacement=f"{batch}-{number}")
            try:
                instances = self.launcher.try_launch(ctx, plan, False)
            except AttemptFailed as failed:
                attempts.append(Attempt(number, offer, where, failed.code, failed.message))
                if failed.skip_region:
                    break
                continue
            started = sorted((self._instance(task_id, i) for i in instances),
                             key=lambda i: i.instance_id)
            try:
                self._play(task_id, ctx, started)
            except OSError as exc:
                self.terminate_instances(task_id, [i.instance_id for i in started])
                raise ProviderError(f"could not start the simulated replacement nodes of task "
                                    f"{task_id}: {exc}; they were terminated") from exc
            return started
        raise CapacityError(
            f"could not start {count} replacement node(s) for task {task_id}: all "
            f"{len(attempts)} attempt(s) failed:\n{format_attempts(attempts)}\nNothing was "
            "left running, and the running nodes were not touched.")

    def _remount(self, task_id: str, spec: TaskSpec, region: str) -> str:
        """The mount lines of a replacement node: the gang's EFS file systems, which exist
        (the launch provisioned them, with mount targets in every zone it tried). A block
        volume stays with the node it is attached to, so such a task is not replaced."""
        blocks = sorted(v.name for v in spec.volumes.values() if v.interface == "block")
        if blocks:
            raise ProviderError(f"task {task_id} has block volume(s) {blocks}, which attach to "
                                "one node only; a lost node is not replaced: launch the task "
                                "again")
        files = {p: v for p, v in spec.volumes.items() if v.interface == "file"}
        found: dict[str, flow_efs.FileSystem] = {}
        efs = self.clients.get("efs", region)
        for path, volume in files.items():
            try:
                fs = flow_efs.find_file_system(efs, volume.name)
            except VolumeError as exc:
                raise ProviderError(f"cannot mount {path} on a replacement node of task "
                                    f"{task_id}: {exc}") from exc
            if fs is None:
                raise ProviderError(f"the EFS file system of volume {volume.name!r} ({path}) "
                                    f"of task {task_id} is gone from {region}; no replacement "
                                    "node was started")
            found[path] = fs
        return flow_efs.mount_script(found)

    def _remaining_hours(self, task_id: str, spec: TaskSpec) -> float | None:
        """What is left of the task's runtime cap (replacements must not outlive it)."""
        cap = spec.max_run_time_hours
        if cap is None:
            return None
        raw = self.store.get(protocol.task_key(task_id))
        if raw is None:
            return cap
        left = cap - (time.time() - TaskRecord.from_json(raw).created_at) / 3600.0
        if left <= 0:
            raise ProviderError(f"task {task_id} is past its max_run_time_hours of {cap:g}; "
                                "no replacement node was started")
        return left

    def _replacement_offers(self, spec: TaskSpec, template: Mapping[str, Any], region: str
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

    def terminate_instances(self, task_id: str, instance_ids: list[str]) -> None:
        """Terminate the named nodes of the task, and nothing else (ids of other tasks, or
        already gone, are left alone). In the simulated cloud their processes are stopped."""
        ids = list(dict.fromkeys(instance_ids))
        if not ids:
            return
        try:
            for region in self._regions_for(task_id):
                terminate_tagged(self.clients.get("ec2", region), task_id, instance_ids=ids)
        except (ClientError, BotoCoreError) as exc:
            raise ProviderError(f"could not terminate nodes {ids} of task {task_id}: {exc}"
                                ) from exc
        if self.simulation is not None:
            self.simulation.stop_instances(task_id, ids)

    def interruption_notice(self, instance_id: str) -> str | None:
        """The spot interruption notice of this node (``instance_id`` is the asking node's
        own: IMDS answers for the instance it runs on), or None when there is none.

        Reads IMDSv2 ``/latest/meta-data/spot/instance-action`` with a cached session token:
        one local HTTP GET per call, cheap enough to poll every few seconds. The notice is
        EC2's JSON text, e.g. ``{"action": "terminate", "time": "2026-01-01T12:00:00Z"}``;
        EC2 stops the instance about two minutes later. Raises ProviderError when the
        metadata service cannot be reached. Simulated nodes have no metadata service unless
        provider_config imds_endpoint names one (``FakeImds``).
        """
        endpoint = self.cfg.imds_endpoint
        if endpoint is None:
            if self.simulation is not None:
                return None
            endpoint = IMDS_ENDPOINT
        endpoint = endpoint.replace("{instance_id}", instance_id)
        with self._lock:
            client = self._imds.get(endpoint)
            if client is None:
                client = self._imds[endpoint] = ImdsClient(endpoint)
        notice = client.get(SPOT_ACTION_PATH)
        return notice.strip() if notice is not None and notice.strip() else None

    # -- teardown ---------------------------------------------------------------------------

    def terminate(self, task_id: str) -> None:
        self.terminate_task(task_id)

    def terminate_task(self, task_id: str) -> Cleanup:
        """``terminate`` with a report: instances and processes stopped, resources deleted
        (or deferred while instances shut down: ``gc`` removes those later)."""
        result = Cleanup()
        regions = self._regions_for(task_id)
        try:
            for region in regions:
                ids = terminate_tagged(self.clients.get("ec2", region), task_id)
                result.deleted.extend(f"{region} instance {i}" for i in ids)
            if self.simulation is not None:
                result.deleted.extend(f"process {pid}" for pid in self.simulation.stop(task_id))
            for region in regions:
                ec2 = self.clients.get("ec2", region)
                found = tagged_resources(ec2, task_id,
                                         placement_groups=self._task_efa.get(task_id, False))
                done = delete_resources(ec2, region, found)
                result.deleted.extend(done.deleted)
                result.deferred.extend(done.deferred)
        except (ClientError, BotoCoreError) as exc:
            code = error_code(exc) if isinstance(exc, ClientError) else type(exc).__name__
            message = error_message(exc) if isinstance(exc, ClientError) else str(exc)
            raise ProviderError(f"could not terminate task {task_id}: {code}: {message}; "
                                "retry, or run `flow gc`") from exc
        return result

    def live_pids(self, task_id: str) -> list[int]:
        """Simulated cloud only: agent pids of the task still running."""
        return self.simulation.live_pids(task_id) if self.simulation is not None else []

    def gc(self, *, dry_run: bool = False) -> _gc.GcReport:
        """Terminate and delete what belongs to ended tasks (or to no task) of this store."""
        return _gc.collect(self, dry_run=dry_run)

    def node_config_of(self, instance_id: str, region: str) -> dict[str, Any]:
        """The provider config a launched instance boots with, read back from its user-data."""
        recorded = self.clients.get("ec2", region).describe_instance_attribute(
            InstanceId=instance_id, Attribute="userData")
        script = base64.b64decode(recorded["UserData"]["Value"]).decode("utf-8")
        boot: dict[str, Any] = json.loads(_userdata.boot_json_from_user_data(script))
        return dict(boot["provider_config"])


def _network_of(raw: Mapping[str, Any]) -> tuple[str, str]:
    """(subnet, security group) of an instance: its own, or its primary interface's (an EFA
    node's live on its network interfaces). Empty strings when it reports none."""
    nics = sorted(raw.get("NetworkInterfaces") or [],
                  key=lambda n: (n.get("Attachment") or {}).get("DeviceIndex", 0))
    primary = nics[0] if nics else {}
    subnet = raw.get("SubnetId") or primary.get("SubnetId") or ""
    groups = raw.get("SecurityGroups") or primary.get("Groups") or []
    return str(subnet), str(groups[0]["GroupId"]) if groups else ""


def _sample_volume_mounts(spec: TaskSpec) -> str:
    """Mount lines as long as the real ones will be (longest ids), to size the user-data."""
    files = {p: flow_efs.FileSystem("fs-" + "f" * 17, v.name, "ap-southeast-3", "available",
                                    v.size_gb)
             for p, v in spec.volumes.items() if v.interface == "file"}
    blocks = {p: flow_ebs.BlockVolume("vol-" + "f" * 17, v.name, "ap-southeast-3a", v.size_gb,
                                      "available", None)
              for p, v in spec.volumes.items() if v.interface == "block"}
    return flow_efs.mount_script(files) + flow_ebs.mount_script(blocks)
