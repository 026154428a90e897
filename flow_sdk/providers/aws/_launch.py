"""Launching a gang: the RunInstances request, and failover across zones, regions and types.

The candidates and their order come from the catalog (``plan_offers``: market preference for
the priority, then price, then region order); within an offer the zones that offer the type are
tried in name order. Each try is ONE ``run_instances`` with MinCount (``min_instances`` or
``num_instances``) and MaxCount (``num_instances``). A capacity error moves on to the next
zone / offer; a quota error skips the rest of that region for the offer; anything else stops
the launch. Whatever a failed try started is terminated before the next one: the ids EC2
returned, what its ClientToken started (its answer may have been lost), and what carries its
task + attempt tags; the final error lists every attempt. A ``LaunchLedger`` keeps every
token and id of a launch (``_rollback``), so an interrupted launch rolls back the same way
(``_gang``).

Replacement nodes (``AwsProvider.add_instances``, after a node loss under ``max_restarts``) go
through the same request and rollback, with exactly ``count`` instances, the gang's attempt tag
(so the running nodes discover them) and a replacement tag of their own: a failed try rolls
back only what it started, never the running gang.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from botocore.exceptions import ConnectionError as BotoConnError

from flow_sdk.catalog import Offer
from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws._clients import error_code, error_message, http_status
from flow_sdk.providers.aws._resources import (
    NODE_ROLE,
    TAG_ATTEMPT,
    TAG_MARKET,
    TAG_PRICE,
    TAG_REPLACEMENT,
    TAG_ROLE,
    RegionContext,
    tags,
)
from flow_sdk.providers.aws._rollback import (
    LaunchLedger,
    alive_by_token,
    terminate_ids,
    terminate_tagged,
)
from flow_sdk.spec import TaskSpec

# Errors that mean "no capacity for this request here now": try the next zone / offer.
CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity", "InsufficientCapacityOnHost",
    "SpotMaxPriceTooLow", "InsufficientSpotCapacity", "Unsupported",
})
# Account quotas are per region and market: skip the region for this offer.
QUOTA_CODES = frozenset({"VcpuLimitExceeded", "MaxSpotInstanceCountExceeded",
                         "InstanceLimitExceeded", "SpotInstanceCountExceeded"})
# Worth the same request again (same ClientToken, so it cannot launch twice).
TRANSIENT_CODES = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException",
                             "InternalError", "InternalFailure", "ServiceUnavailable",
                             "Unavailable", "RequestTimeout", "RequestTimeoutException"})
TRANSIENT_RETRIES = 4
# A task's new instance profile can take seconds to reach EC2, which until then refuses it as
# an invalid iamInstanceProfile: the same request again every PROFILE_RETRY_S, this many times.
PROFILE_RETRIES = 30
ROOT_VOLUME_GB = 200


def client_token(task_id: str, attempt: int | str) -> str:
    """Idempotency token of one launch attempt (<= 64 ASCII characters)."""
    return "flow-" + hashlib.sha256(f"{task_id}/{attempt}".encode()).hexdigest()[:40]


def market_options(offer: Offer, spec: TaskSpec) -> dict[str, Any] | None:
    """``InstanceMarketOptions`` for a spot offer (None for on-demand); the price cap, when
    set, is the spot MaxPrice."""
    if offer.market != "spot":
        return None
    spot: dict[str, Any] = {"SpotInstanceType": "one-time",
                            "InstanceInterruptionBehavior": "terminate"}
    if spec.max_price_per_hour is not None:
        spot["MaxPrice"] = f"{spec.max_price_per_hour:.4f}"
    return {"MarketType": "spot", "SpotOptions": spot}


def imds_hop_limit(spec: TaskSpec) -> int:
    """How many network hops an IMDSv2 token may travel: 1 keeps the role's credentials on
    the node itself; 2 only for a task that runs in its container image (the agent runs
    inside it)."""
    return 2 if spec.image is not None else 1


def network_interfaces(subnet_id: str, security_group: str, efa_cards: int
                       ) -> list[dict[str, Any]]:
    """One EFA interface per network card (the first carries the node's address)."""
    return [{"NetworkCardIndex": card, "DeviceIndex": 0 if card == 0 else 1,
             "InterfaceType": "efa", "SubnetId": subnet_id, "Groups": [security_group],
             "DeleteOnTermination": True} for card in range(max(efa_cards, 1))]


@dataclass(frozen=True)
class AttemptPlan:
    """Everything one attempt's request is built from."""

    task_id: str
    spec: TaskSpec
    offer: Offer
    zone: str
    subnet_id: str
    security_group: str
    ami_id: str
    root_device: str
    key_name: str | None  # None: no key pair (a replacement of a gang launched without one)
    instance_profile: str  # a profile name, or its ARN (what describe_instances reports)
    user_data: str
    attempt: int
    store_tag: str
    efa: bool
    placement_group: str | None
    count: int | None = None  # replacements: exactly this many; None: the spec's gang
    replacement: str | None = None  # the replacement try's id (its tag and client token)

    @property
    def token_key(self) -> str:
        return (str(self.attempt) if self.replacement is None
                else f"{self.attempt}/replacement/{self.replacement}")


def run_instances_request(plan: AttemptPlan) -> dict[str, Any]:
    """The keyword arguments of the attempt's one ``run_instances`` call."""
    spec = plan.spec
    extra = {TAG_ROLE: NODE_ROLE, TAG_ATTEMPT: str(plan.attempt), TAG_MARKET: plan.offer.market,
             TAG_PRICE: f"{plan.offer.usd_per_hour:.4f}"}
    if plan.replacement is not None:
        extra[TAG_REPLACEMENT] = plan.replacement
    instance_tags = tags(plan.task_id, plan.store_tag, **extra)
    profile_key = "Arn" if plan.instance_profile.startswith("arn:") else "Name"
    request: dict[str, Any] = {
        "ImageId": plan.ami_id,
        "InstanceType": plan.offer.instance_type,
        "MinCount": plan.count or spec.min_instances or spec.num_instances,
        "MaxCount": plan.count or spec.num_instances,
        "ClientToken": client_token(plan.task_id, plan.token_key),
        "UserData": plan.user_data,
        "IamInstanceProfile": {profile_key: plan.instance_profile},
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled",
                            "HttpPutResponseHopLimit": imds_hop_limit(spec)},
        "InstanceInitiatedShutdownBehavior": "terminate",
        "Placement": {"AvailabilityZone": plan.zone},
        "BlockDeviceMappings": [{"DeviceName": plan.root_device, "Ebs": {
            "VolumeSize": ROOT_VOLUME_GB, "VolumeType": "gp3", "DeleteOnTermination": True}}],
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": instance_tags},
            {"ResourceType": "volume", "Tags": tags(plan.task_id, plan.store_tag)},
        ],
    }
    if plan.key_name is not None:
        request["KeyName"] = plan.key_name
    if plan.placement_group is not None:
        request["Placement"]["GroupName"] = plan.placement_group
    if plan.efa:
        request["NetworkInterfaces"] = network_interfaces(
            plan.subnet_id, plan.security_group, plan.offer.efa_interfaces)
    else:
        request["SubnetId"] = plan.subnet_id
        request["SecurityGroupIds"] = [plan.security_group]
    options = market_options(plan.offer, spec)
    if options is not None:
        request["InstanceMarketOptions"] = options
    return request


@dataclass(frozen=True)
class Attempt:
    """One try of the failover, for the final error message."""

    number: int | None  # None: skipped without a request
    offer: Offer
    zone: str | None
    code: str
    message: str

    def __str__(self) -> str:
        where = self.zone or self.offer.region
        head = f"#{self.number}" if self.number is not None else "--"
        return (f"{head} {self.offer.instance_type} {self.offer.market} in {where} "
                f"(${self.offer.usd_per_hour:,.2f}/h): {self.code}: {self.message}")


class AttemptFailed(Exception):
    """A try did not produce a gang; what it started was rolled back."""

    def __init__(self, code: str, message: str, *, skip_region: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.skip_region = skip_region


def _alive(instance: dict[str, Any]) -> bool:
    return instance.get("State", {}).get("Name") not in ("shutting-down", "terminated")


class GangLauncher:
    """Runs one attempt: the request, idempotent retries, the gang check and the rollback."""

    retry_base_s = 1.0  # backoff between transient retries (tests set 0)
    profile_retry_s = 2.0  # between tries while a new instance profile propagates (tests: 0)

    def __init__(self, sleep: Callable[[float], None] = time.sleep) -> None:
        self._sleep = sleep

    def try_launch(self, ctx: RegionContext, plan: AttemptPlan, profile_is_new: bool,
                   ledger: LaunchLedger | None = None) -> list[dict[str, Any]]:
        """The gang's instances, or AttemptFailed after rolling the attempt back. ``ledger``
        records the request's token before it is sent and the ids EC2 answers with."""
        request = run_instances_request(plan)
        required = request["MinCount"]
        response: dict[str, Any] | None = None
        last = "no response"
        ledger = ledger if ledger is not None else LaunchLedger()
        ledger.sent(ctx.region, request["ClientToken"])
        for retry in range(TRANSIENT_RETRIES + 1):
            if retry:
                self._sleep(self.retry_base_s * 2 ** (retry - 1))
            try:
                response = self._run(ctx, request, profile_is_new)
                ledger.returned(ctx.region, (i["InstanceId"] for i in
                                             response.get("Instances", [])))
                break
            except ClientError as exc:
                code, message = error_code(exc), error_message(exc)
                if code in CAPACITY_CODES:
                    self._rollback(ctx, plan, request["ClientToken"])
                    raise AttemptFailed(code, message) from exc
                if code in QUOTA_CODES:
                    self._rollback(ctx, plan, request["ClientToken"])
                    raise AttemptFailed(code, message + " (request a quota increase in the "
                                        "Service Quotas console)", skip_region=True) from exc
                if code in TRANSIENT_CODES or http_status(exc) >= 500:
                    last = f"{code}: {message}"
                    continue
                self._rollback(ctx, plan, request["ClientToken"])
                waited = (f" (EC2 still refused the task's new instance profile after "
                          f"{PROFILE_RETRIES + 1} tries over "
                          f"{PROFILE_RETRIES * self.profile_retry_s:g}s; retry the launch)"
                          if profile_is_new and _profile_not_ready(exc) else "")
                raise ProviderError(
                    f"run_instances for {plan.offer.instance_type} in {plan.zone} failed: "
                    f"{code}: {message}{waited}") from exc
            except (BotoConnError, BotoCoreError) as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
        if response is None:  # a lost response may still have started instances
            self._rollback(ctx, plan, request["ClientToken"])
            raise AttemptFailed("RetriesExhausted", f"{TRANSIENT_RETRIES + 1} tries with "
                                f"ClientToken {request['ClientToken']}, last: {last}")
        instances = [i for i in response.get("Instances", []) if _alive(i)]
        if len(instances) < required:
            self._rollback(ctx, plan, request["ClientToken"],
                           [i["InstanceId"] for i in response.get("Instances", [])])
            raise AttemptFailed("PartialGang", f"got {len(instances)} of the {required} "
                                "instances asked for; terminated them")
        return instances

    def _run(self, ctx: RegionContext, request: dict[str, Any], profile_is_new: bool
             ) -> dict[str, Any]:
        """One ``run_instances``, sent again (same ClientToken) while EC2 does not yet see a
        new instance profile, at most ``PROFILE_RETRIES`` times; other errors propagate."""
        response: dict[str, Any]
        for _ in range(PROFILE_RETRIES):
            try:
                response = ctx.ec2_launch.run_instances(**request)
                return response
            except ClientError as exc:
                if not (profile_is_new and _profile_not_ready(exc)):
                    raise
            self._sleep(self.profile_retry_s)
        response = ctx.ec2_launch.run_instances(**request)
        return response

    def _rollback(self, ctx: RegionContext, plan: AttemptPlan, token: str,
                  returned: list[str] | None = None) -> None:
        """Terminate what this attempt started (never the running gang of a replacement):
        the ids EC2 returned, what its token started, what carries its tags."""
        ec2 = ctx.ec2
        ids = list(dict.fromkeys((returned or []) + alive_by_token(ec2, [token])))
        terminate_ids(ec2, ids, self.retry_base_s)
        terminate_tagged(ec2, plan.task_id, plan.attempt, plan.replacement)


def _profile_not_ready(exc: ClientError) -> bool:
    """EC2's answer while a new instance profile has not reached it."""
    return error_code(exc) == "InvalidParameterValue" and "iamInstanceProfile" in (
        error_message(exc))


def format_attempts(attempts: list[Attempt]) -> str:
    return "\n".join(f"  {a}" for a in attempts)


@dataclass(frozen=True)
class Try:
    """One candidate of the failover: an offer in a zone. After a quota error the remaining
    tries of the same ``group`` are skipped (the quota holds for all of them)."""

    offer: Offer
    zone: str
    ctx: RegionContext
    group: Hashable
    subnet_id: str | None = None  # None: the zone's default subnet


@dataclass
class Failover:
    """What the failover tried (``attempts``), and what it got."""

    attempts: list[Attempt] = field(default_factory=list)
    tries: int = 0
    launched: tuple[Try, AttemptPlan, list[dict[str, Any]]] | None = None

    def capped(self, max_attempts: int) -> bool:
        return self.tries >= max_attempts


def failover(candidates: Iterable[Try], plan_for: Callable[[int, Try], AttemptPlan],
             launcher: GangLauncher, max_attempts: int, profile_is_new: bool,
             attempts: list[Attempt] | None = None,
             ledger: LaunchLedger | None = None) -> Failover:
    """Try ``candidates`` in order, at most ``max_attempts`` requests, until one starts its
    instances (``launched``). A capacity error moves on; a quota error also skips the rest of
    its try's group. ``plan_for(number, try)`` builds the request of attempt ``number``; the
    gang and the replacement launch both run this one loop. Other errors propagate.
    ``ledger`` collects every request's token and every answer's ids, so that whoever
    called can roll back an interrupted failover."""
    result = Failover(attempts if attempts is not None else [])
    skipped: set[Hashable] = set()
    pending = iter(candidates)
    while result.tries < max_attempts:  # checked before the next candidate is looked up
        candidate = next(pending, None)
        if candidate is None:
            break
        if candidate.group in skipped:
            continue
        result.tries += 1
        plan = plan_for(result.tries, candidate)
        try:
            instances = launcher.try_launch(candidate.ctx, plan, profile_is_new, ledger)
        except AttemptFailed as failed:
            result.attempts.append(Attempt(result.tries, candidate.offer, candidate.zone,
                                           failed.code, failed.message))
            if failed.skip_region:
                skipped.add(candidate.group)
            continue
        result.launched = (candidate, plan, instances)
        break
    return result
