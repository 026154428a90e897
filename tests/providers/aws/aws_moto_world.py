"""Helpers of the aws provider tests (the fixtures in conftest.py use them): the moto world,
fault injection in moto's EC2 backend, and request recording through botocore events.

What moto 5.2.1 lacks is filled in here, test-side only: placement groups (not implemented at
all; a minimal create/describe/delete responder), the Deep Learning AMI's public SSM parameter
(reserved names cannot be put; it is published into the backend the way moto publishes the
Amazon Linux ones), capacity errors (raised from the backend as HTTP 500, as AWS does), the
instance profile of every instance of a launch (moto associates it with the first one only),
S3's ExpectedBucketOwner (moto ignores it; S3 answers 403 AccessDenied when another
account owns the bucket), and DescribeInstances' ``client-token`` filter (moto keeps the
token but cannot filter on it).
"""

from __future__ import annotations

import base64
import copy
import datetime
import re
import shlex
import socket
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.ec2.models.instances import InstanceBackend
from moto.ec2 import utils as moto_ec2_utils
from moto.ec2.responses import EC2Response
from moto.s3.exceptions import S3AccessDeniedError
from moto.s3.models import s3_backends
from moto.s3.responses import S3Response
from werkzeug.exceptions import HTTPException

from flow_sdk import wire
from flow_sdk.providers import sdkwheel
from flow_sdk.wire import BootConfig, TaskRecord, signing
from flow_sdk.providers.aws import AwsProvider, _userdata
from flow_sdk.providers.aws._config import DLAMI_PARAMETER
from flow_sdk.providers.aws._resources import TAG_ATTEMPT, tag_value
from flow_sdk.providers.base import Instance, LaunchRequest
from flow_sdk.system.procs import is_alive as process_alive
from flow_sdk.sim import AwsSimProvider, NodeSettings, SimulatedNodes, instance_pids
from flow_sdk.sim._gaps import ACTIONS, PLACEMENT_GROUPS, profile_for_every_instance
from flow_sdk.spec import TaskSpec, build_task_spec

# Where a rendered bootstrap fetches its SDK wheel (user-data tests render with this).
NODE_CODE = _userdata.NodeCode(
    url=f"s3://flow-test-bucket/flow/{wire.code_key('ab' * 32)}", sha256="ab" * 32,
    filename=sdkwheel.wheel_name("0.1.0"), python=sdkwheel.python_version(),
    region="us-east-1", log_group="/flow/t-1", log_retention_days=30, boot_timeout_s=1200)

ACCOUNT = "123456789012"
REGIONS = ("us-east-1", "us-east-2", "us-west-2")
BUCKET = "flow-test-bucket"

# -- no network beyond loopback ------------------------------------------------------------

_real_connect = socket.socket.connect


def loopback_only(self: socket.socket, address: Any) -> None:
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = str(address[0])
        if not (host.startswith("127.") or host in ("::1", "localhost")):
            raise AssertionError(f"test tried to reach {address}: only 127.0.0.0/8 is allowed")
    _real_connect(self, address)


# -- what moto 5.2.1 lacks ------------------------------------------------------------------

# Placement groups: moto 5.2.1 answers "not implemented"; the simulated cloud's server
# serves them (flow_sdk.sim._gaps), and so does the tests' in-process moto.


# The instance profile of every instance of a launch: moto 5.2.1 associates it with the
# first one only; the simulated cloud's server fixes that (flow_sdk.sim._gaps), and so does
# the tests' in-process moto.


OWNER_HEADER = "x-amz-expected-bucket-owner"


def bucket_owner_checked(original: Callable[..., Any]) -> Callable[..., Any]:
    """An S3 bucket or key responder that refuses, as S3 does, a request whose
    ExpectedBucketOwner is not the account that owns the bucket."""

    def respond(self: Any, request: Any, full_url: str) -> Any:
        expected = request.headers.get(OWNER_HEADER)
        owner = s3_backends.bucket_accounts.get(self.bucket_name)
        if expected and owner is not None and owner[1] != expected:
            raise S3AccessDeniedError()
        return original(self, request, full_url)

    return respond


@dataclass
class S3Wire:
    """Every S3 request that reached moto, from any process: (bucket, method and path,
    the ExpectedBucketOwner it carried or None)."""

    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    def to(self, bucket: str) -> list[tuple[str, str, str | None]]:
        return [r for r in self.requests if r[0] == bucket]


def s3_recording(wire: S3Wire, original: Callable[..., Any]) -> Callable[..., Any]:
    def respond(self: Any, request: Any, full_url: str) -> Any:
        wire.requests.append((str(self.bucket_name or ""), f"{request.method} {full_url}",
                              request.headers.get(OWNER_HEADER)))
        return original(self, request, full_url)

    return respond


def placement_groups(region: str = "us-east-1") -> dict[str, dict[str, Any]]:
    return dict(PLACEMENT_GROUPS[(ACCOUNT, region)])


_AMIS: dict[str, str] = {}


def publish_dlami(url: str) -> dict[str, str]:
    """Publish the DLAMI public parameter in every test region, pointing at a moto AMI."""
    from moto.ssm.models import Parameter, ssm_backends

    amis = {}
    for region in REGIONS:
        ami = _AMIS.get(region)
        if ami is None:  # moto's public AMIs are static data: look them up once per session
            ec2 = boto3.client("ec2", region_name=region, endpoint_url=url)
            ami = _AMIS[region] = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        params = ssm_backends[ACCOUNT][region]._parameters
        defaultdict.__getitem__(params, DLAMI_PARAMETER).append(Parameter(  # type: ignore[abstract]
            account_id=ACCOUNT, name=DLAMI_PARAMETER, value=ami, parameter_type="String",
            description=None, allowed_pattern=None, keyid=None,
            last_modified_date=datetime.datetime.now(datetime.timezone.utc), version=1,
            data_type="aws:ec2:image"))
        amis[region] = ami
    return amis


# -- the per-test AWS world ----------------------------------------------------------------


@dataclass
class Recorder:
    """Botocore-event recording of one session: API calls by name and RunInstances params."""

    calls: list[str] = field(default_factory=list)
    http_requests: int = 0
    run_instances: list[dict[str, Any]] = field(default_factory=list)

    def attach(self, session: boto3.session.Session) -> boto3.session.Session:
        events = session.events

        def on_params(params: dict[str, Any], **_: Any) -> None:
            self.run_instances.append(copy.deepcopy(params))

        def on_call(model: Any, **_: Any) -> None:
            self.calls.append(f"{model.service_model.service_name}.{model.name}")

        def on_send(**_: Any) -> None:
            self.http_requests += 1

        events.register("provide-client-params.ec2.RunInstances", on_params)
        events.register("before-call", on_call)
        events.register("before-send", on_send)
        return session

    def count(self, name: str) -> int:
        return self.calls.count(name)


@dataclass
class AwsWorld:
    url: str
    tmp: Path
    amis: dict[str, str]

    @property
    def sim_root(self) -> Path:
        return self.tmp / "sim"

    def stop_simulated(self) -> list[int]:
        """Stop every simulated instance of this world (a failed test stops its nodes too)."""
        return SimulatedNodes(NodeSettings(str(self.sim_root)), self.url).stop_all()

    def config(self, **overrides: Any) -> dict[str, Any]:
        # image_python: the fake image runs this interpreter's Python (as a user names an
        # image's), so check() passes the same-Python rule
        config: dict[str, Any] = {"region": "us-east-1", "bucket": BUCKET,
                                  "endpoint_url": self.url, "ssh_cidr": "127.0.0.1/32",
                                  "image_python": sdkwheel.python_version()}
        config.update(overrides)
        return config

    def sim_config(self, **overrides: Any) -> dict[str, Any]:
        """The ``aws-sim`` provider_config of this world: its moto server, its root, and any
        aws or simulated-node setting. The simulated image keeps the SDK environments of this
        test session, all its runners (by wheel digest), so a node installs the wheel only on the
        first boot."""
        envs = _session_root(self.tmp) / "sim-envs"
        config = self.config(root=str(self.sim_root), envs=str(envs),
                             **overrides)
        if "image_python" not in overrides:
            del config["image_python"]  # the simulated image's Python: its interpreter's
        return config

    def provider(self, recorder: Recorder | None = None, **overrides: Any) -> AwsProvider:
        session = boto3.session.Session()
        if recorder is not None:
            recorder.attach(session)
        return AwsProvider.from_config(self.config(**overrides), session=session)

    def sim_provider(self, recorder: Recorder | None = None, **overrides: Any
                     ) -> AwsSimProvider:
        session = boto3.session.Session()
        if recorder is not None:
            recorder.attach(session)
        return AwsSimProvider.from_config(self.sim_config(**overrides), session=session)

    def client(self, service: str, region: str = "us-east-1") -> Any:
        return boto3.client(service, region_name=region, endpoint_url=self.url)

    def instances(self, region: str = "us-east-1") -> list[dict[str, Any]]:
        reservations = self.client("ec2", region).describe_instances()["Reservations"]
        return [i for r in reservations for i in r["Instances"]]

    def non_terminated(self, region: str = "us-east-1") -> list[str]:
        return [i["InstanceId"] for i in self.instances(region)
                if i["State"]["Name"] not in ("terminated", "shutting-down")]

    def launch_leftovers(self, region: str) -> list[str]:
        """What a launch creates in ``region`` that is still there: instances not terminated,
        security groups (besides the default ones), key pairs, placement groups."""
        ec2 = self.client("ec2", region)
        found = [f"{region} instance {i}" for i in self.non_terminated(region)]
        found += [f"{region} security group {g['GroupName']}"
                  for g in ec2.describe_security_groups()["SecurityGroups"]
                  if g["GroupName"] != "default"]
        found += [f"{region} key pair {k['KeyName']}"
                  for k in ec2.describe_key_pairs()["KeyPairs"]]
        found += [f"{region} placement group {name}" for name in placement_groups(region)]
        return found

    def created_anything(self) -> list[str]:
        """Whatever flow could have created, in every test region: instances (terminated ones
        too), security groups (besides the default ones), key pairs, placement groups,
        objects, log groups, IAM roles and instance profiles. Empty for an untouched world."""
        found = []
        for region in REGIONS:
            found += [f"{region} instance {i['InstanceId']}" for i in self.instances(region)
                      if i["InstanceId"] not in self.non_terminated(region)]
            found += self.launch_leftovers(region)
            found += [f"{region} log group {g['logGroupName']}"
                      for g in self.client("logs", region).describe_log_groups()["logGroups"]]
        found += [f"object {o['Key']}" for o in self.client("s3").list_objects_v2(
            Bucket=BUCKET).get("Contents", [])]
        iam = self.client("iam")
        found += [f"role {r['RoleName']}" for r in iam.list_roles()["Roles"]]
        found += [f"instance profile {p['InstanceProfileName']}"
                  for p in iam.list_instance_profiles()["InstanceProfiles"]]
        return found


# -- what reached moto over the wire --------------------------------------------------------


@dataclass
class Wire:
    """Every RunInstances that reached the moto server, from any process (the test's, or a
    simulated node's), as the query parameters it arrived with. moto's model drops some of
    them (MaxCount, spot MaxPrice), so this is the record of what AWS would have been sent."""

    run_instances: list[dict[str, str]] = field(default_factory=list)

    def markets(self) -> list[str]:
        return [r.get("InstanceMarketOptions.MarketType", "on-demand")
                for r in self.run_instances]

    @staticmethod
    def tags(request: dict[str, str], resource: str = "instance") -> dict[str, str]:
        """The tags of one TagSpecification of a recorded request."""
        for n in range(1, 10):
            if request.get(f"TagSpecification.{n}.ResourceType") == resource:
                found: dict[str, str] = {}
                for m in range(1, 50):
                    key = request.get(f"TagSpecification.{n}.Tag.{m}.Key")
                    if key is None:
                        return found
                    found[key] = request[f"TagSpecification.{n}.Tag.{m}.Value"]
        return {}


def wire_recording(wire: Wire) -> Callable[..., Any]:
    original: Callable[..., Any] = EC2Response.run_instances

    def run_instances(self: Any) -> Any:
        wire.run_instances.append({k: v[0] for k, v in self.querystring.items() if v})
        return original(self)

    return run_instances


# -- fault injection in moto's EC2 backend -------------------------------------------------


class Ec2HttpError(HTTPException):
    """An EC2 error document with the status AWS uses (InsufficientInstanceCapacity: 500)."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__()
        self.code = status
        self.description = (
            '<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error>'
            f"<Code>{code}</Code><Message>{message}</Message></Error></Errors>"
            "<RequestID>flow-test</RequestID></Response>")

    def get_headers(self, *args: Any, **kwargs: Any) -> list[tuple[str, str]]:
        return [("Content-Type", "text/xml")]


HOLD_MAX_S = 300.0  # a held answer is sent at the latest after this long


@dataclass
class _Rule:
    kind: str  # "capacity" | "partial" | "lose" | "transient" | "hold"
    instance_type: str | None
    zone: str | None
    region: str | None
    code: str
    status: int
    times: int | None  # None: every time
    launched: int = 0
    market: str | None = None  # "spot" | "on-demand"
    message: str | None = None  # None: EC2's capacity message
    untagged: bool = False  # "hold": the instances are not listed by tag (yet)

    def matches(self, region: str, zone: str, instance_type: str, market: str) -> bool:
        return ((self.instance_type is None or self.instance_type == instance_type)
                and (self.market is None or self.market == market)
                and (self.zone is None or self.zone == zone)
                and (self.region is None or self.region == region)
                and (self.times is None or self.times > 0))


@dataclass
class Ec2Faults:
    """Rules applied, in order, to every run_instances that reaches moto's backend."""

    rules: list[_Rule] = field(default_factory=list)
    seen: list[tuple[str, str, str]] = field(default_factory=list)  # (region, zone, type)
    holding: threading.Event = field(default_factory=threading.Event)  # a "hold" began
    release: threading.Event = field(default_factory=threading.Event)  # held answers go out
    held: list[str] = field(default_factory=list)  # ids of the instances held answers started

    def capacity(self, *, instance_type: str | None = None, zone: str | None = None,
                 region: str | None = None, market: str | None = None,
                 code: str = "InsufficientInstanceCapacity", status: int = 500,
                 times: int | None = None) -> None:
        self.rules.append(_Rule("capacity", instance_type, zone, region, code, status, times,
                                market=market))

    def partial(self, launched: int, *, instance_type: str | None = None,
                zone: str | None = None, times: int | None = None) -> None:
        """moto starts only ``launched`` instances (fewer than MinCount)."""
        self.rules.append(_Rule("partial", instance_type, zone, None, "", 200, times, launched))

    def lose_response(self, *, zone: str | None = None, times: int | None = None) -> None:
        """moto starts the instances, then the response is lost (HTTP 500 InternalError)."""
        self.rules.append(_Rule("lose", None, zone, None, "InternalError", 500, times))

    def transient(self, *, times: int, code: str = "RequestLimitExceeded",
                  status: int = 503) -> None:
        """Throttled before anything starts."""
        self.rules.append(_Rule("transient", None, None, None, code, status, times))

    def profile_not_ready(self, *, times: int | None) -> None:
        """EC2 does not see the request's new instance profile yet (as after CreateInstance-
        Profile, for some seconds): refused before anything starts."""
        self.rules.append(_Rule(
            "transient", None, None, None, "InvalidParameterValue", 400, times,
            message="Value (flow-task-x) for parameter iamInstanceProfile.name is invalid. "
                    "Invalid IAM Instance Profile name"))
    def hold(self, *, times: int = 1, untagged: bool = False) -> None:
        """moto starts the instances, sets ``holding``, and answers only once ``release`` is
        set: the caller is left waiting on a request that EC2 has carried out. ``untagged``:
        the instances carry no tags, as when EC2 has not yet listed a new gang by tag."""
        self.rules.append(_Rule("hold", None, None, None, "", 200, times, untagged=untagged))



S3_RESPONDERS = ("_bucket_response", "_key_response")  # every bucket and object request


def faulty_run_instances(faults: Ec2Faults) -> Callable[..., Any]:
    """moto's InstanceBackend.run_instances with ``faults`` applied first."""
    original: Callable[..., Any] = InstanceBackend.run_instances

    def run_instances(self: Any, image_id: str, count: int, user_data: Any,
                      security_group_names: list[str], **kwargs: Any) -> Any:
        region = kwargs.get("region_name") or self.region_name
        zone = kwargs.get("placement") or ""
        instance_type = kwargs.get("instance_type", "")
        market = "spot" if kwargs.get("instance_market_options") == "spot" else "on-demand"
        faults.seen.append((region, zone, instance_type))
        for rule in faults.rules:
            if not rule.matches(region, zone, instance_type, market):
                continue
            if rule.times is not None:
                rule.times -= 1
            if rule.kind in ("capacity", "transient"):
                raise Ec2HttpError(rule.code, rule.message or (
                    f"We currently do not have sufficient {instance_type} capacity in the "
                    f"Availability Zone you requested ({zone})."), rule.status)
            if rule.kind == "partial":
                return original(self, image_id, rule.launched, user_data, security_group_names,
                                **kwargs)
            if rule.kind == "lose":
                original(self, image_id, count, user_data, security_group_names, **kwargs)
                raise Ec2HttpError(rule.code, "An internal error has occurred.", rule.status)
            if rule.kind == "hold":
                if rule.untagged:
                    kwargs = {**kwargs, "tags": {}}
                reservation = original(self, image_id, count, user_data, security_group_names,
                                       **kwargs)
                faults.held.extend(i.id for i in reservation.instances)
                faults.holding.set()
                faults.release.wait(HOLD_MAX_S)
                return reservation
        return original(self, image_id, count, user_data, security_group_names, **kwargs)

    return run_instances


def spec(**options: Any) -> TaskSpec:
    return build_task_spec(app="t", name="train", provider="aws", **options)


TEST_SECRET = "0" * 64  # the task secret of every task ``launch`` starts (hex)


def launch(provider: AwsProvider, task_id: str, task_spec: TaskSpec, *, record: bool = True,
           created_at: float | None = None) -> list[Instance]:
    """Launch like FlowApp does: the task record first, sealed with the task's secret
    (``TEST_SECRET``; unless ``record`` is off), the gang."""
    if record:
        sealed = signing.SignedStore(provider.store, bytes.fromhex(TEST_SECRET))
        sealed.put_record(wire.task_key(task_id), TaskRecord(
            task_id, task_spec.model_dump(mode="json"), "0" * 64,
            time.time() if created_at is None else created_at, 29400, 29500))
    boot = BootConfig(task_id, "aws", provider.config(), secret=TEST_SECRET)
    return provider.launch(LaunchRequest(task_id, task_spec, boot))


def launch_ids(provider: AwsProvider, task_id: str, task_spec: TaskSpec, *, record: bool = True,
               created_at: float | None = None) -> list[str]:
    """:func:`launch`, returning the instance ids."""
    instances = launch(provider, task_id, task_spec, record=record, created_at=created_at)
    return [instance.instance_id for instance in instances]


def node_config_of(provider: AwsProvider, instance_id: str, region: str) -> dict[str, Any]:
    """The provider config a launched instance boots with, read back from its user-data."""
    recorded = provider.clients.get("ec2", region).describe_instance_attribute(
        InstanceId=instance_id, Attribute="userData")
    script = base64.b64decode(recorded["UserData"]["Value"]).decode("utf-8")
    return dict(boot_of(script).provider_config)


_BOOT_LINE_RE = re.compile(r"^FLOW_BOOT_JSON=(.*)$", re.MULTILINE)


def boot_of(script: str) -> BootConfig:
    """The boot configuration a rendered user-data script starts the agent with (tests read
    what a launch sent; the library never parses its own script back)."""
    match = _BOOT_LINE_RE.search(script)
    assert match is not None, "the user-data has no FLOW_BOOT_JSON line"
    words = shlex.split(match.group(1))
    assert len(words) == 1, "FLOW_BOOT_JSON is not a single shell word"
    return BootConfig.decode(words[0])


# -- the simulated cloud's nodes, as tests look at them ------------------------------------


def live_pids(provider: AwsSimProvider, task_id: str) -> list[int]:
    """The task's simulated instance processes, and every process of its instances, still
    running."""
    pids = []
    for rec in provider.sim.records(task_id):
        if rec["pid"] is not None and process_alive(rec["pid"], rec["ticks"]):
            pids.append(rec["pid"])
        pids.extend(instance_pids(rec["tag"]))
    return sorted(set(pids))


def agent_pid(provider: AwsSimProvider, task_id: str, instance_id: str) -> int:
    """The pid of a simulated node's agent (``python -m flow_sdk.node.agent`` on the instance)."""
    tags = [r["tag"] for r in provider.sim.records(task_id) if r["instance_id"] == instance_id]
    assert tags, f"the simulated cloud has no node {instance_id} of task {task_id}"
    for pid in instance_pids(tags[0]):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if b"flow_sdk.node.agent" in argv:
            return pid
    raise AssertionError(f"node {instance_id} of task {task_id} runs no agent (yet)")


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


def describe(provider: AwsProvider, task_id: str) -> list[InstanceDetail]:
    """The task's instances with type, zone, market and addresses, by instance id."""
    details = []
    for _region, raw in provider.nodes.describe_in_regions(task_id):
        base = provider.nodes.instance(task_id, raw)
        details.append(InstanceDetail(
            instance_id=base.instance_id, instance_type=str(raw.get("InstanceType")),
            zone=str(raw.get("Placement", {}).get("AvailabilityZone")),
            market=base.market, state=str(raw.get("State", {}).get("Name")),
            address=base.address, public_ip=raw.get("PublicIpAddress"),
            attempt=tag_value(raw, TAG_ATTEMPT), launched_at=base.launched_at))
    return sorted(details, key=lambda d: d.instance_id)


# -- the pieces of a moto world, shared by the aws provider and provider contract tests --------


_gaps_users = [0]  # how many moto_gaps() are open: the first applies them, the last removes


@contextmanager
def moto_gaps() -> Iterator[None]:
    """Placement groups, and instance profiles on every instance of a launch (applied once
    however many test directories of one run ask for them)."""
    _gaps_users[0] += 1
    original = EC2Response.run_instances
    s3_originals = {name: getattr(S3Response, name) for name in S3_RESPONDERS}
    filters = moto_ec2_utils.filter_dict_attribute_mapping
    if _gaps_users[0] == 1:
        for name, fn in ACTIONS.items():
            setattr(EC2Response, name, fn)
        setattr(EC2Response, "run_instances", profile_for_every_instance(original))  # noqa: B010
        for name, fn in s3_originals.items():
            setattr(S3Response, name, bucket_owner_checked(fn))
        filters["client-token"] = "client_token"
    try:
        yield
    finally:
        _gaps_users[0] -= 1
        if _gaps_users[0] == 0:
            setattr(EC2Response, "run_instances", original)  # noqa: B010
            filters.pop("client-token", None)
            for name in ACTIONS:
                delattr(EC2Response, name)
            for name, fn in s3_originals.items():
                setattr(S3Response, name, fn)


def _session_root(tmp: Path) -> Path:
    """The test session's temporary root, shared by its xdist runners (each has its own
    ``popen-gwN`` folder below it)."""
    base = tmp.parent
    return base.parent if base.name.startswith("popen-gw") else base


def fresh_world(moto_url: str, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> AwsWorld:
    """The moto server reset, fake credentials in this process's environment, the DLAMI
    published, the test bucket created, and no launch backoff."""
    from flow_testing import fake_aws_environment

    from flow_sdk.providers.aws._launch import GangLauncher

    fake_aws_environment(monkeypatch, tmp)
    urllib.request.urlopen(urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST"),
                           timeout=10).read()
    PLACEMENT_GROUPS.clear()
    monkeypatch.setattr(GangLauncher, "retry_base_s", 0.0)
    monkeypatch.setattr(GangLauncher, "profile_retry_s", 0.0)
    world = AwsWorld(url=moto_url, tmp=tmp, amis=publish_dlami(moto_url))
    world.client("s3").create_bucket(Bucket=BUCKET)
    return world
