"""``AwsProvider``: EC2 nodes, an S3 object store, CloudWatch Logs, EFS/EBS volumes, ``gc``.

The provider checks and plans here; each other job lives in a module of its own and takes
the shared ``AwsNodes``: the gang launch (``_gang``), replacements (``_replace``), SSH
(``_ssh``), teardown (``_teardown``), ``gc`` (``_gc``), volumes (``_volumes``). Nodes are
started and reached through the node runtime it is given (``_runtime``; real EC2's by
default).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from flow_sdk.catalog import (
    CatalogError,
    Offer,
    OfferNotFoundError,
    UnknownRegionError,
    plan_offers,
)
from flow_sdk import wire
from flow_sdk.providers import sdkwheel
from flow_sdk.errors import FieldProblem, ProviderError, VolumeError
from flow_sdk.providers.aws import _gang, _gc, _replace, _ssh, _teardown
from flow_sdk.providers.aws._clients import Clients
from flow_sdk.providers.aws._config import AwsConfig
from flow_sdk.providers.capabilities import Capabilities
from flow_sdk.providers.launch import ShippedWheel, node_launch
from flow_sdk.providers.aws._cwlogs import CloudWatchLogStore
from flow_sdk.providers.aws._iam import (
    LaunchPins,
    TaskAccess,
    check_policy_size,
    role_name,
    role_path,
    task_policy,
)
from flow_sdk.providers.aws._imds import IMDS_ENDPOINT, SPOT_ACTION_PATH, ImdsClient
from flow_sdk.providers.aws._nodes import AwsNodes
from flow_sdk.providers.aws._resources import Cleanup
from flow_sdk.providers.aws._runtime import Ec2Runtime, NodeRuntime
from flow_sdk.providers.aws._s3store import S3ObjectStore
from flow_sdk.providers.aws._volumes import AwsVolumes, sample_mounts
from flow_sdk.providers.base import (
    Instance,
    LaunchPlan,
    LaunchRequest,
    LogStore,
    ObjectStore,
    Provider,
    SshEndpoint,
    Volumes,
)
from flow_sdk.providers.gcreport import GcReport
from flow_sdk.spec import TaskSpec

_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
_SAMPLE_TASK_ID = "t" * 64  # longer than any task id: check() sizes the user-data with it
# check() sizes the user-data with this stand-in for the SDK wheel (as long as a real one)
_SAMPLE_CODE = ShippedWheel(wire.code_key("0" * 64), "0" * 64,
                       sdkwheel.wheel_name("0.0.0.dev0+" + "0" * 16), "3.12")


class AwsProvider(Provider):
    """EC2 through boto3. See the package docstring for what each part does."""

    name: ClassVar[str] = "aws"
    capabilities: ClassVar[Capabilities] = Capabilities.every()

    def __init__(self, config: AwsConfig, *, session: boto3.session.Session | None = None,
                 runtime: NodeRuntime | None = None) -> None:
        self.cfg = config
        self.clients = Clients(config.endpoint_url, session)
        self._bucket = config.bucket
        self._owner = config.bucket_owner
        self._lock = threading.Lock()
        is_node = config.launch is not None
        self._store = S3ObjectStore(lambda: self.clients.get("s3", config.region),
                                    self.bucket_name, config.prefix, config.region,
                                    create_bucket=not is_node, owner=self.bucket_owner,
                                    expiry_days=config.object_expiry_days)
        self._logs = CloudWatchLogStore(lambda: self.clients.get("logs", config.region),
                                        config.log_group_prefix, config.log_retention_days)
        self._imds: dict[str, ImdsClient] = {}
        self.runtime: NodeRuntime = runtime if runtime is not None else Ec2Runtime()
        self.nodes = AwsNodes(config, self.clients, self.runtime,
                              AwsVolumes(self.clients, config.region, self.name), self._store,
                              self.bucket_name, self.bucket_owner)

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
        data["bucket_owner"] = self.bucket_owner()
        return data

    def bucket_name(self) -> str:
        """The bucket; by default ``flow-sdk-<account id>-<region>`` (one STS call, once)."""
        if self._bucket is None:
            with self._lock:
                if self._bucket is None:
                    try:
                        account = str(self.clients.get("sts", self.cfg.region)
                                      .get_caller_identity()["Account"])
                    except (ClientError, BotoCoreError) as exc:
                        raise ProviderError(
                            f"could not identify the AWS account for the default bucket ({exc})"
                            "; configure AWS credentials, or set provider_config bucket") from exc
                    if self._owner not in (None, account):
                        raise ProviderError(
                            f"provider_config bucket_owner {self._owner} is not this account "
                            f"({account}), which owns the default bucket; leave bucket_owner "
                            "unset, or name the other account's bucket in provider_config "
                            "bucket")
                    self._owner = account
                    self._bucket = f"flow-sdk-{account}-{self.cfg.region}"
        return self._bucket

    def bucket_owner(self) -> str | None:
        """The account every S3 request expects to own the bucket (``ExpectedBucketOwner``):
        provider_config ``bucket_owner``, else the caller's account for the default bucket,
        else None (a named bucket is not checked)."""
        if self._bucket is None:
            self.bucket_name()
        return self._owner

    @property
    def store_tag(self) -> str:
        """Tagged on every resource this provider creates; ``gc`` touches only its own."""
        return self.nodes.store_tag

    @property
    def launcher(self) -> Any:
        """The gang launcher (tests set its retry backoff)."""
        return self.nodes.launcher

    @property
    def store(self) -> ObjectStore:
        return self._store

    @property
    def logs(self) -> LogStore:
        return self._logs

    @property
    def volumes(self) -> Volumes:
        return self.nodes.volumes

    # -- checks and plans -------------------------------------------------------------------

    def _offers(self, spec: TaskSpec) -> list[Offer]:
        """The offers to try, in order (an InfiniBand ask is served by EFA: see plan_offers)."""
        return plan_offers(spec, regions=list(self.cfg.launch_regions))

    def check(self, spec: TaskSpec) -> list[FieldProblem]:
        """Everything about ``spec`` that can be found wrong before anything is created: an
        offer within the price cap, priority and interconnect (the error lists the cheapest
        offers), volumes, the image reference, the
        user-data size, the node policy's size (mounts) and a runtime cap beyond the expiry
        of the task's objects."""
        problems = []
        try:
            self._offers(spec)
        except (UnknownRegionError, OfferNotFoundError, CatalogError) as exc:
            problems.append(FieldProblem(exc.field, str(exc)))
        if spec.image is not None and not _IMAGE_RE.match(spec.image):
            problems.append(FieldProblem(
                "image", f"{spec.image!r} is not a container image reference such as "
                "'nvcr.io/nvidia/pytorch:24.05-py3'"))
        else:
            try:
                sample = LaunchRequest(_SAMPLE_TASK_ID, spec, wire.BootConfig(
                    _SAMPLE_TASK_ID, self.name, {}, secret="0" * 64))
                self.nodes.render_user_data(
                    node_launch(sample, (_SAMPLE_CODE,)), spec, _SAMPLE_TASK_ID,
                    self.cfg.region, self.cfg.max_launch_attempts,
                    bucket=self._bucket or "b" * 63, bucket_owner=self._owner or "0" * 12,
                    volume_mounts=sample_mounts(spec))
            except VolumeError as exc:
                problems.append(FieldProblem("volumes", str(exc)))
            except ProviderError as exc:
                problems.append(FieldProblem("image" if spec.image else "provider_config",
                                             str(exc)))
        return problems + self._check_node_policy(spec) + self._check_expiry(spec)

    def _check_node_policy(self, spec: TaskSpec) -> list[FieldProblem]:
        """The task's node policy, sized with the longest names it can hold, must fit IAM's
        inline-policy limit: its S3 mounts make it grow (and a very long prefix)."""
        if self.cfg.instance_profile is not None:
            return []
        bucket = "b" * 63
        store_tag = f"s3://{bucket}/{self.cfg.prefix}"
        access = TaskAccess(
            task_id=_SAMPLE_TASK_ID, bucket=bucket, prefix=self.cfg.prefix, store_tag=store_tag,
            region="ap-southeast-2", log_group=self.cfg.log_group_prefix + _SAMPLE_TASK_ID,
            code_key=_SAMPLE_CODE.key, payload_digest="0" * 64, bucket_owner="0" * 12,
            mounts=tuple(sorted(set(spec.mounts.values()))), replacements=spec.max_restarts > 0)
        pins = LaunchPins("ap-southeast-2", "p6-b200.48xlarge", "ami-" + "0" * 17,
                          "sg-" + "0" * 17, "flow-" + _SAMPLE_TASK_ID, "flow-" + _SAMPLE_TASK_ID)
        role = f"arn:aws:iam::{'0' * 12}:role{role_path(store_tag)}{role_name(store_tag, '')}"
        for field, checked in (("provider_config", replace(access, mounts=())),
                               ("mounts", access)):
            try:
                check_policy_size(task_policy(checked, role, pins), checked.mounts)
            except ProviderError as exc:
                return [FieldProblem(field, str(exc))]
        return []

    def _check_expiry(self, spec: TaskSpec) -> list[FieldProblem]:
        """A task must not outlive its own records: the bucket expires them after
        ``object_expiry_days``."""
        days = self.cfg.object_expiry_days
        cap = spec.max_run_time_hours
        if days is None or cap is None or cap <= days * 24:
            return []
        return [FieldProblem("max_run_time_hours", (
            f"the task may run {cap:g} h, longer than provider_config object_expiry_days="
            f"{days} ({days * 24} h), after which the bucket deletes its records while it "
            f"runs; lower max_run_time_hours, or raise object_expiry_days to at least "
            f"{math.ceil(cap / 24)}"))]

    def launch_problems(self, spec: TaskSpec) -> list[FieldProblem]:
        """The nodes must run the caller's Python minor (cloudpickle does not cross minor
        versions): a launch refuses, a plan warns. A task image brings its own Python: its
        nodes' pip and agent refuse a mismatch at boot, since it cannot be known here."""
        if spec.image is not None:
            return []
        mine = sdkwheel.python_version()
        theirs = self.cfg.node_python
        if theirs is None:
            return [FieldProblem("provider_config", (
                "provider_config names its own image (ami_id or ami_ssm_parameter) but not "
                "its Python; add image_python, e.g. {'image_python': '" + mine + "'}, so the "
                "launch can check that the nodes run the caller's Python"))]
        if theirs == mine:
            return []
        return [FieldProblem("provider_config", (
            f"the nodes' image runs Python {theirs}, but this program runs Python {mine}; "
            "functions and arguments travel by cloudpickle, which does not work across "
            f"Python minor versions. Run the launch from Python {theirs}, or give "
            f"provider_config ami_id and image_python='{mine}' for an image with Python "
            f"{mine}, or set the task's image= to a container with Python {mine}"))]

    def plan(self, spec: TaskSpec) -> LaunchPlan:
        """The offer ``launch`` tries first (its first zone is chosen at launch), and how many
        more the failover would try."""
        offers = self._planned(spec, "this task")
        first = offers[0]
        return LaunchPlan(self.name, first.instance_type, first.region, first.market,
                          first.usd_per_hour, spec.num_instances, spec.max_run_time_hours,
                          alternatives=len(offers) - 1, workers_per_node=spec.slots_per_node,
                          warnings=tuple(p.message for p in self.launch_problems(spec)))

    def _planned(self, spec: TaskSpec, what: str) -> list[Offer]:
        try:
            return self._offers(spec)
        except (OfferNotFoundError, UnknownRegionError, CatalogError) as exc:
            raise ProviderError(f"no AWS offer for {what}: {exc}") from exc

    # -- nodes ------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> list[Instance]:
        offers = self._planned(request.spec, f"task {request.task_id}")
        return _gang.launch(self.nodes, request, offers)

    def list_instances(self, task_id: str) -> list[Instance]:
        return self.nodes.instances(task_id, [raw for _region, raw in
                                              self.nodes.describe_in_regions(task_id)])

    def ssh_endpoint(self, task_id: str, instance_id: str) -> SshEndpoint:
        return _ssh.ssh_endpoint(self.nodes, task_id, instance_id)

    def add_instances(self, request: LaunchRequest, count: int) -> list[Instance]:
        """Start ``count`` nodes that join the task's running gang (``_replace``)."""
        if count < 1:
            raise ProviderError(f"add_instances needs a count of at least 1, got {count}")
        try:
            return _replace.add_instances(self.nodes, request, count)
        except (ClientError, BotoCoreError) as exc:
            raise ProviderError(f"could not start replacement nodes for task "
                                f"{request.task_id}: {exc}") from exc

    def terminate_instances(self, task_id: str, instance_ids: list[str]) -> None:
        _teardown.terminate_instances(self.nodes, task_id, instance_ids)

    def terminate(self, task_id: str) -> None:
        self.terminate_task(task_id)

    def terminate_task(self, task_id: str) -> Cleanup:
        """``terminate`` with a report: instances and processes stopped, resources deleted
        (or deferred while instances shut down: ``gc`` removes those later)."""
        return _teardown.terminate_task(self.nodes, task_id)

    def gc(self, *, dry_run: bool = False, ended: Mapping[str, str] | None = None
           ) -> GcReport:
        """Terminate and delete what belongs to ended tasks (or to no task) of this store;
        ``ended``: tasks ``flow_sdk.lifecycle`` judged ended, with why."""
        return _gc.collect(self.nodes, dry_run=dry_run, ended=ended)

    def metadata_endpoint(self) -> str | None:
        """The instance metadata service a node asks when provider_config names none: EC2's
        own (a subclass whose nodes have none returns None: no notices)."""
        return IMDS_ENDPOINT

    def interruption_notice(self, instance_id: str) -> str | None:
        """The spot interruption notice of this node (``instance_id`` is the asking node's
        own: IMDS answers for the instance it runs on), or None when there is none.

        Reads IMDSv2 ``/latest/meta-data/spot/instance-action`` with a cached session token:
        one local HTTP GET per call, cheap enough to poll every few seconds. The notice is
        EC2's JSON text, e.g. ``{"action": "terminate", "time": "2026-01-01T12:00:00Z"}``;
        EC2 stops the instance about two minutes later. Raises ProviderError when the
        metadata service cannot be reached. The endpoint is provider_config
        ``imds_endpoint``, else EC2's own (``metadata_endpoint``).
        """
        endpoint = self.cfg.imds_endpoint or self.metadata_endpoint()
        if endpoint is None:
            return None
        endpoint = endpoint.replace("{instance_id}", instance_id)
        with self._lock:
            client = self._imds.get(endpoint)
            if client is None:
                client = self._imds[endpoint] = ImdsClient(endpoint)
        notice = client.get(SPOT_ACTION_PATH)
        return notice.strip() if notice is not None and notice.strip() else None


