"""What every job of the aws provider shares: its settings and clients, the node runtime,
the volumes, the gang launcher, and how a task's instances are found (by task tag, in the
task's regions) and reported.

``AwsProvider`` builds one ``AwsNodes``; launch (``_gang``), replacement (``_replace``),
SSH (``_ssh``), teardown (``_teardown``) and ``gc`` (``_gc``) each take it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from flow_sdk import wire
from flow_sdk.providers import sdkwheel
from flow_sdk.errors import ProviderError
from flow_sdk.wire import TaskRecord
from flow_sdk.providers.aws import _userdata
from flow_sdk.providers.aws._clients import Clients
from flow_sdk.providers.aws._config import AwsConfig
from flow_sdk.providers.aws._credentials import reject_credentials
from flow_sdk.providers.aws._iam import (
    LaunchPins,
    TaskAccess,
    create_task_role,
    delete_task_role,
    put_task_policy,
    role_name,
    secret_parameter,
)
from flow_sdk.providers.aws._launch import AttemptPlan, GangLauncher
from flow_sdk.providers.aws._resources import (
    TAG_ATTEMPT,
    TAG_PRICE,
    TAG_TASK,
    tag_value,
)
from flow_sdk.providers.aws._runtime import NodeBoot, NodeRuntime
from flow_sdk.providers.aws._tasksecret import delete_task_secret, put_task_secret
from flow_sdk.providers.aws._volumes import AwsVolumes
from flow_sdk.providers import launch
from flow_sdk.providers.launch import NodeLaunch, ShippedWheel
from flow_sdk.providers.base import Instance, InstanceState, ObjectStore
from flow_sdk.spec import TaskSpec

_STATES: dict[str, InstanceState] = {"pending": "pending", "running": "running"}


@dataclass
class AwsNodes:
    """The aws provider's shared parts (see the module docstring)."""

    cfg: AwsConfig
    clients: Clients
    runtime: NodeRuntime
    volumes: AwsVolumes
    store: ObjectStore
    bucket_name: Callable[[], str]
    bucket_owner: Callable[[], str | None]
    launcher: GangLauncher = field(default_factory=GangLauncher)
    task_regions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    task_efa: dict[str, bool] = field(default_factory=dict)
    # the roles this provider created for launches in flight: task id -> (access, role ARN)
    _roles: dict[str, tuple[TaskAccess, str]] = field(default_factory=dict)

    @property
    def store_tag(self) -> str:
        """Tagged on every resource this provider creates; ``gc`` touches only its own."""
        return f"s3://{self.bucket_name()}/{self.cfg.prefix}"

    @property
    def iam(self) -> Any:
        return self.clients.get("iam", self.cfg.region)

    def task_access(self, task_id: str, spec: TaskSpec, code: ShippedWheel) -> TaskAccess:
        """What the task's nodes may reach (``_iam``): its payload is the one its task
        record (written before the launch) names."""
        raw = self.store.get(wire.task_key(task_id))
        record = TaskRecord.from_json(raw) if raw else None
        return TaskAccess(
            task_id=task_id, bucket=self.bucket_name(), prefix=self.cfg.prefix,
            store_tag=self.store_tag, region=self.cfg.region,
            log_group=self.cfg.log_group_prefix + task_id, code_key=code.key,
            payload_digest=record.payload_digest if record else None,
            code_digest=record.code_digest or None if record else None,
            bucket_owner=self.bucket_owner(), mounts=tuple(sorted(set(spec.mounts.values()))),
            replacements=spec.max_restarts > 0 or spec.spares > 0, block_volumes=tuple(sorted(
                v.name for v in spec.volumes.values() if v.interface == "block")),
            pool=spec.pool is not None)

    def task_access_for(self, task_id: str, spec: TaskSpec, code: ShippedWheel, secret: str
                        ) -> tuple[str, bool]:
        """Store the task's secret where only its nodes read it (``_tasksecret``); then the
        instance profile the task's nodes run with, and whether it is new (EC2 may refuse a
        new one for some seconds): provider_config ``instance_profile``, else the task's
        own, created here (``_iam``). ``delete_task_access`` undoes both."""
        put_task_secret(self.clients.get("ssm", self.cfg.region), self.store_tag, task_id,
                        secret)
        if self.cfg.instance_profile is not None:
            return self.cfg.instance_profile, False
        access = self.task_access(task_id, spec, code)
        role_arn = create_task_role(self.iam, access)
        self._roles[task_id] = (access, role_arn)
        return role_name(access.store_tag, task_id), True

    def grant_replacements(self, task_id: str, plan: AttemptPlan) -> None:
        """Once the gang has landed: let the task's role replace lost nodes, pinned to the
        gang's region, type, image and groups (only a role of flow's own, only with
        ``max_restarts``)."""
        known = self._roles.get(task_id)
        if known is None or not known[0].replacements:
            return
        access, role_arn = known
        put_task_policy(self.iam, access, role_arn, LaunchPins(
            region=plan.offer.region, instance_type=plan.offer.instance_type,
            image_id=plan.ami_id, security_group=plan.security_group,
            placement_group=plan.placement_group, key_name=plan.key_name))

    def delete_task_access(self, task_id: str) -> list[str]:
        """Delete the task's secret parameter, then its role, instance profile and policy
        (none with provider_config ``instance_profile``); returns what was deleted."""
        self._roles.pop(task_id, None)
        deleted = delete_task_secret(self.clients.get("ssm", self.cfg.region), self.store_tag,
                                     task_id)
        if self.cfg.instance_profile is not None:
            return deleted
        return deleted + delete_task_role(self.iam, self.store_tag, task_id)

    def ship_code(self) -> ShippedWheel:
        """The SDK wheel the nodes install: on a node, the one its gang was launched with;
        on the client, this process's own ``flow_sdk`` packed (``sdkwheel``, cached by
        digest) and stored content-addressed, once."""
        if self.cfg.code is not None:
            return self.cfg.code
        return launch.ship(self.store, sdkwheel.build())

    def render_user_data(self, launch: NodeLaunch, spec: TaskSpec, task_id: str, region: str,
                         attempt: int, *, bucket: str | None = None,
                         bucket_owner: str | None = None, volume_mounts: str = ""
                         ) -> NodeBoot:
        """The boot of one gang's nodes (and of their replacements): ``launch`` rendered as
        user-data. They install its one wheel, the SDK's (``ship_code``); ``volume_mounts``
        are the bash lines that mount the task's volumes (``AwsVolumes.provision``).
        ``bucket`` and ``bucket_owner`` stand in for the provider's own (``check`` sizes the
        script without asking STS). The nodes' provider config carries the node runtime's own
        keys as they are; it replaces the client's in the boot configuration."""
        cfg = self.cfg
        if len(launch.wheels) != 1:
            raise ProviderError(f"an aws node installs one wheel, the SDK's; this launch ships "
                                f"{[w.filename for w in launch.wheels]}")
        code = launch.wheels[0]
        node_config = cfg.for_node(task_id, region, attempt, code).to_dict()
        if bucket is None:
            bucket, bucket_owner = self.bucket_name(), self.bucket_owner()
        node_config["bucket"], node_config["bucket_owner"] = bucket, bucket_owner
        runtime_keys = self.runtime.node_config()
        clash = sorted(set(runtime_keys) & set(node_config))
        if clash:
            raise ProviderError(f"the node runtime's config keys {clash} clash with the aws "
                                "provider's own; give the runtime keys of its own")
        node_config.update(runtime_keys)
        reject_credentials(node_config)
        fetch = _userdata.NodeCode(
            url=f"s3://{bucket}/{cfg.prefix}{code.key}", sha256=code.sha256,
            filename=code.filename, python=launch.python, region=cfg.region,
            log_group=cfg.log_group_prefix + task_id,
            log_retention_days=cfg.log_retention_days,
            boot_timeout_s=math.ceil(launch.boot_timeout_s), bucket_owner=bucket_owner)
        inputs = _userdata.BootstrapInputs(  # the secret stays out: the nodes read it
            launch.boot_without_secret().with_provider_config(node_config), fetch,  # from SSM
            secret_parameter(f"s3://{bucket}/{cfg.prefix}", task_id),  # the store's tag
            launch.image, launch.gpus, _userdata.interconnect_of(launch.interconnect),
            launch.mount_paths, launch.max_run_time_hours, volume_mounts)
        return NodeBoot(task_id, region, attempt, spec, inputs, _userdata.render(inputs))

    # -- discovery --------------------------------------------------------------------------

    def regions_for(self, task_id: str) -> tuple[str, ...]:
        """The regions the task's instances live in: the node's own, the launch's, else the
        task record's region or every launch region."""
        launch = self.cfg.launch
        if launch is not None and launch.task_id == task_id:
            return (launch.region,)
        cached = self.task_regions.get(task_id)
        if cached is not None:
            return cached
        regions = self.cfg.launch_regions
        raw = self.store.get(wire.task_key(task_id))
        if raw is not None:
            spec = TaskRecord.from_json(raw).spec
            if spec.get("region"):
                regions = (str(spec["region"]),)
            self.task_efa[task_id] = _userdata.interconnect_of(
                spec.get("internode_interconnect")) == "efa"
        self.task_regions[task_id] = regions
        return regions

    def instance(self, task_id: str, raw: Mapping[str, Any]) -> Instance:
        address = self.runtime.address(str(raw.get("PrivateIpAddress") or ""))
        state = _STATES.get(raw.get("State", {}).get("Name", ""), "terminated")
        price = tag_value(dict(raw), TAG_PRICE)
        return Instance(
            str(raw["InstanceId"]), task_id, address, state, raw["LaunchTime"].timestamp(),
            usd_per_hour=float(price) if price else 0.0,
            market="spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand",
            instance_type=str(raw.get("InstanceType", "")),
            zone=raw.get("Placement", {}).get("AvailabilityZone"))

    def instances(self, task_id: str, raws: Sequence[Mapping[str, Any]]) -> list[Instance]:
        return sorted((self.instance(task_id, raw) for raw in raws),
                      key=lambda i: i.instance_id)

    def describe_in_regions(self, task_id: str, states: list[str] | None = None
                            ) -> list[tuple[str, dict[str, Any]]]:
        """Every instance of the task: ONE paged describe_instances by task tag per region
        (a node sees its own gang only)."""
        filters = [{"Name": f"tag:{TAG_TASK}", "Values": [task_id]}]
        launch = self.cfg.launch
        if launch is not None and launch.task_id == task_id:
            filters.append({"Name": f"tag:{TAG_ATTEMPT}", "Values": [str(launch.attempt)]})
        if states is not None:
            filters.append({"Name": "instance-state-name", "Values": states})
        found: list[tuple[str, dict[str, Any]]] = []
        for region in self.regions_for(task_id):
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
