"""A small, explicit IAM policy evaluator for the tests (moto 5.2.1 has no policy simulation).

It decides one request (an action on one resource ARN, with the condition keys the request
carries) against one identity policy the way IAM does for what flow's node policies use:

* an explicit Deny in any matching statement wins, else any matching Allow allows, else the
  request is implicitly denied;
* a statement matches when one of its ``Action`` patterns matches the action (case-
  insensitive, ``*`` and ``?`` wildcards), one of its ``Resource`` patterns matches the ARN
  (case-sensitive, same wildcards), and every condition holds;
* conditions: every operator of a statement and every key of an operator must hold; a key's
  values are alternatives. ``StringEquals`` and ``StringLike`` are false when the request lacks
  the key; ``Null`` ``"true"`` holds when the key is absent, ``"false"`` when present.

Anything else (NotAction, NotResource, other operators, policy variables) is refused with an
AssertionError, so a policy that grows beyond this evaluator fails its tests rather than being
half-evaluated. RunInstances is authorized per resource it touches: ``run_instances_resources``
lists them, with their condition keys, from the request boto3 is given.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

Context = Mapping[str, str]
_OPERATORS = ("StringEquals", "StringLike", "Null")


def _as_list(value: str | Sequence[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _pattern(text: str, *, ignore_case: bool) -> re.Pattern[str]:
    assert "${" not in text, f"policy variables are not evaluated here: {text}"
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in text)
    return re.compile(f"^{body}$", re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL)


def like(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    """IAM's wildcard match: ``*`` any run of characters, ``?`` one character."""
    return _pattern(pattern, ignore_case=ignore_case).match(value) is not None


def _condition_holds(condition: Mapping[str, Mapping[str, Any]], context: Context) -> bool:
    for operator, keys in condition.items():
        assert operator in _OPERATORS, f"condition operator {operator} is not evaluated here"
        for key, wanted in keys.items():
            values = _as_list(wanted)
            have = context.get(key)
            if operator == "Null":
                assert values in (["true"], ["false"]), f"Null takes 'true' or 'false': {wanted}"
                if (have is None) != (values == ["true"]):
                    return False
            elif have is None:
                return False
            elif operator == "StringEquals" and have not in values:
                return False
            elif operator == "StringLike" and not any(like(v, have) for v in values):
                return False
    return True


def _matches(statement: Mapping[str, Any], action: str, resource: str, context: Context
             ) -> bool:
    unsupported = {"NotAction", "NotResource", "NotPrincipal", "Principal"} & set(statement)
    assert not unsupported, f"{sorted(unsupported)} are not evaluated here"
    assert statement["Effect"] in ("Allow", "Deny"), statement
    if not any(like(a, action, ignore_case=True) for a in _as_list(statement["Action"])):
        return False
    if not any(like(r, resource) for r in _as_list(statement["Resource"])):
        return False
    return _condition_holds(statement.get("Condition", {}), context)


def decide(policy: Mapping[str, Any], action: str, resource: str,
           context: Context | None = None) -> str:
    """``"Allow"``, ``"Deny"`` (explicit) or ``"ImplicitDeny"``."""
    effects = {s["Effect"] for s in policy["Statement"]
               if _matches(s, action, resource, context or {})}
    if "Deny" in effects:
        return "Deny"
    return "Allow" if "Allow" in effects else "ImplicitDeny"


def allowed(policy: Mapping[str, Any], action: str, resource: str,
            context: Context | None = None) -> bool:
    return decide(policy, action, resource, context) == "Allow"


def _tags(request: Mapping[str, Any], resource_type: str) -> dict[str, str]:
    for spec in request.get("TagSpecifications", []):
        if spec["ResourceType"] == resource_type:
            return {f"aws:RequestTag/{t['Key']}": t["Value"] for t in spec["Tags"]}
    return {}


def run_instances_resources(request: Mapping[str, Any], region: str, account: str
                            ) -> list[tuple[str, dict[str, str]]]:
    """Every resource a RunInstances ``request`` (boto3's keyword arguments) is authorized
    on, with the condition keys EC2 gives each: the new instance (its request tags, type and
    metadata options), its volumes, its network interfaces, the image, subnet, security
    groups, key pair, placement group, and a spot request for a spot launch."""
    ec2 = f"arn:aws:ec2:{region}:{account}"
    metadata = request.get("MetadataOptions", {})
    instance = {**_tags(request, "instance"), "ec2:InstanceType": request["InstanceType"],
                "ec2:MetadataHttpTokens": metadata.get("HttpTokens", "optional")}
    found = [(f"{ec2}:instance/*", instance),
             (f"{ec2}:volume/*", _tags(request, "volume")),
             (f"{ec2}:network-interface/*", _tags(request, "network-interface")),
             (f"arn:aws:ec2:{region}::image/{request['ImageId']}", {})]
    interfaces = request.get("NetworkInterfaces") or []
    subnets = {request["SubnetId"]} if "SubnetId" in request else {
        n["SubnetId"] for n in interfaces}
    groups = set(request.get("SecurityGroupIds", [])) | {
        g for n in interfaces for g in n.get("Groups", [])}
    found += [(f"{ec2}:subnet/{s}", {}) for s in sorted(subnets)]
    found += [(f"{ec2}:security-group/{g}", {}) for g in sorted(groups)]
    if "KeyName" in request:
        found.append((f"{ec2}:key-pair/{request['KeyName']}", {}))
    group = request.get("Placement", {}).get("GroupName")
    if group:
        found.append((f"{ec2}:placement-group/{group}", {}))
    if request.get("InstanceMarketOptions", {}).get("MarketType") == "spot":
        found.append((f"{ec2}:spot-instances-request/*", {}))
    return found


def run_instances_denials(policy: Mapping[str, Any], request: Mapping[str, Any], region: str,
                          account: str) -> list[str]:
    """The resources of ``request`` the policy does NOT allow RunInstances on (empty: the
    launch is allowed)."""
    return [arn for arn, context in run_instances_resources(request, region, account)
            if not allowed(policy, "ec2:RunInstances", arn, context)]
