"""The nodes' IAM: one role, instance profile and inline policy per task, scoped to that task.

An instance profile's credentials carry no tag of the instance they run on, so one role shared
by the tasks of a store cannot tell them apart: code in task A could read B's arguments, forge
B's results or kill B's nodes. Each task's nodes therefore run with a role of their own
(``flow-task-<digest of store and task>``, under the IAM path ``/flow-sdk/<store digest>/``,
tagged with the task id), whose one inline policy allows:

* the task's own objects: get, put and delete ``<prefix>tasks/<task id>/*``, list only under
  that folder; read-only the two shared objects it needs: its payload ``payloads/<digest>``
  and the SDK wheel ``code/<sha256>.whl``. With a known bucket owner every S3 statement also
  requires ``s3:ResourceAccount`` to be that account;
* its own CloudWatch log group (``<log_group_prefix><task id>``) and its streams;
* reading its own secret, the SSM SecureString ``/flow-sdk/<store digest>/<task id>``
  (``_tasksecret``);
* describing instances, subnets, VPCs, zone offerings and EFS file systems (IAM has no
  narrower form for these Describe calls);
* read-only its S3 mounts (a ListBucket per bucket, limited to the mounted prefixes, and
  GetObject under them): grants that go away with the task;
* with ``max_restarts`` only, what replacing lost nodes takes, granted once the gang has
  landed and pinned to it (``LaunchPins``): TerminateInstances only on instances tagged with
  this task, this store and the node role; RunInstances only in the gang's region, for
  instances and volumes tagged with this task and store, of the gang's instance type
  (``ec2:InstanceType``) with IMDSv2 required, from the gang's image, into the gang's security
  group, placement group and key pair; tags only as part of that launch; iam:PassRole only
  for this task's own role, only to EC2. A task without ``max_restarts`` gets none of these.

Replacement launches are constrained by condition keys and exact resource ARNs in this one
policy rather than by a per-task launch template: a template can pin neither the user-data
nor the count either, it would be one more per-task resource in each region to create and
clean up, and the replacement would need a second request path; the policy pins type, image,
region and groups, and every instance it allows carries the task's tags, so teardown and
``flow gc`` reclaim it. No IAM condition bounds MinCount/MaxCount: how many replacements a
compromised node of the task could start is bounded only by the account's quotas, each of
them one of this task's nodes with this task's rights.

The role is created at launch, before the first RunInstances (EC2 may refuse a new profile for
some seconds: the launcher retries for a bounded time), and deleted with the task: by teardown,
by a failed launch's rollback, and by ``flow gc`` for tasks that ended. IAM limits a role's
inline policies to 10,240 characters (whitespace not counted); a task's policy is well under
that unless it mounts many S3 locations, which ``check`` refuses naming ``mounts``.

With provider_config ``instance_profile`` the nodes run with that profile instead, for every
task, and nothing here is created or deleted: scoping it is then its owner's job.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from flow_sdk import wire
from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws._clients import error_code, error_message, tolerating
from flow_sdk.providers.aws._resources import NODE_ROLE, TAG_STORE, TAG_TASK
from flow_sdk.spec.s3uri import folder_prefix, split_s3_uri

TASK_POLICY_NAME = "flow-sdk-task"
ROLE_NAME_PREFIX = "flow-task-"
POLICY_LIMIT = 10_240  # characters of a role's inline policies, whitespace not counted
_TASK_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")  # no IAM wildcard can hide in an ARN
_TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
    "Action": "sts:AssumeRole"}]}


@dataclass(frozen=True)
class TaskAccess:
    """What one task's nodes may reach; ``task_policy`` turns it into the policy."""

    task_id: str
    bucket: str
    prefix: str  # the store's key prefix in the bucket
    store_tag: str
    region: str  # the store's region: CloudWatch Logs
    log_group: str  # the task's log group
    code_key: str  # the SDK wheel's key, under the prefix
    payload_digest: str | None  # None: no task record named one (nothing to read)
    bucket_owner: str | None
    mounts: tuple[str, ...] = ()  # the task's S3 mount URIs
    replacements: bool = False  # max_restarts > 0: the nodes may replace lost nodes
    block_volumes: tuple[str, ...] = ()  # names of the task's EBS (block) volumes
    code_digest: str | None = None  # the call's code, stored apart from its arguments
    # A pool's nodes: ``task_id`` is the pool's id, and the role reaches the pool's folder and
    # log group and those of its tasks (whose ids start with the pool's), and their payloads.
    pool: bool = False


@dataclass(frozen=True)
class LaunchPins:
    """Where the task's gang landed: what a replacement launch is pinned to."""

    region: str
    instance_type: str
    image_id: str
    security_group: str
    placement_group: str | None
    key_name: str | None


def role_path(store_tag: str) -> str:
    """The IAM path of a store's task roles (``gc`` lists them by it)."""
    return f"/flow-sdk/{hashlib.sha256(store_tag.encode()).hexdigest()[:16]}/"


def role_name(store_tag: str, task_id: str) -> str:
    """The name of a task's role and instance profile (at most 64 characters)."""
    digest = hashlib.sha256(f"{store_tag}\0{task_id}".encode()).hexdigest()[:32]
    return ROLE_NAME_PREFIX + digest


def secret_parameter(store_tag: str, task_id: str) -> str:
    """The name of the SSM parameter that holds the task's secret (``_tasksecret``)."""
    return role_path(store_tag) + task_id


def mount_statements(mounts: Sequence[str]) -> list[dict[str, Any]]:
    """Read-only access for the task's S3 mounts (``s3://bucket/prefix``): per bucket one
    ``s3:ListBucket`` limited to the mounted prefixes, and one ``s3:GetObject`` on the mounted
    prefixes' objects only."""
    prefixes: dict[str, set[str]] = {}
    for uri in mounts:
        bucket, key = split_s3_uri(uri)
        prefixes.setdefault(bucket, set()).add(folder_prefix(key))
    statements: list[dict[str, Any]] = []
    for index, bucket in enumerate(sorted(prefixes)):
        listing: dict[str, Any] = {"Sid": f"ListMount{index}", "Effect": "Allow",
                                   "Action": "s3:ListBucket",
                                   "Resource": f"arn:aws:s3:::{bucket}"}
        if "" not in prefixes[bucket]:
            listing["Condition"] = {"StringLike": {
                "s3:prefix": [f"{p}*" for p in sorted(prefixes[bucket])]}}
        statements.append(listing)
    if prefixes:
        statements.append({"Sid": "ReadMounts", "Effect": "Allow", "Action": "s3:GetObject",
                           "Resource": [f"arn:aws:s3:::{bucket}/{p}*"
                                        for bucket in sorted(prefixes)
                                        for p in sorted(prefixes[bucket])]})
    return statements


def format_statements(block_volumes: Sequence[str]) -> list[dict[str, Any]]:
    """The node that makes the file system of a blank EBS volume flow created marks it
    formatted (``_ebs``): the one tag, on the task's own block volumes only."""
    if not block_volumes:
        return []
    return [{"Sid": "MarkVolumesFormatted", "Effect": "Allow", "Action": "ec2:CreateTags",
             "Resource": "arn:aws:ec2:*:*:volume/*",
             "Condition": {
                 "StringEquals": {"aws:ResourceTag/flow:volume": sorted(block_volumes)},
                 "ForAllValues:StringEquals": {"aws:TagKeys": ["flow:formatted"]}}}]


def _owned(statement: dict[str, Any], owner: str | None) -> dict[str, Any]:
    if owner is not None:
        condition = statement.setdefault("Condition", {})
        condition.setdefault("StringEquals", {})["s3:ResourceAccount"] = owner
    return statement


def task_policy(access: TaskAccess, role_arn: str, pins: LaunchPins | None = None
                ) -> dict[str, Any]:
    """The task's node policy (see the module docstring); the replacement statements only
    when ``access.replacements`` and the gang has landed (``pins``)."""
    bucket, owner = access.bucket, access.bucket_owner
    store = f"arn:aws:s3:::{bucket}/{access.prefix}"
    # a pool's folder without its slash: ``tasks/<pool id>*`` holds the pool's own folder and
    # its tasks' (``tasks/<pool id>.<task>/``), payloads included; pool ids never extend one
    # another (a fixed-width random suffix), so no other pool's objects match
    folder = access.prefix + (wire.task_prefix(access.task_id).rstrip("/") if access.pool
                              else wire.task_prefix(access.task_id))
    shared = [store + access.code_key]
    shared += [store + wire.payload_key(d) for d in (access.payload_digest, access.code_digest)
               if d is not None]
    group = f"arn:aws:logs:{access.region}:*:log-group:{access.log_group}" + (
        "*" if access.pool else "")
    statements: list[dict[str, Any]] = [
        _owned({"Sid": "TaskObjects", "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                "Resource": f"arn:aws:s3:::{bucket}/{folder}*"}, owner),
        _owned({"Sid": "ListTaskObjects", "Effect": "Allow", "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{bucket}",
                "Condition": {"StringLike": {"s3:prefix": f"{folder}*"}}}, owner),
        _owned({"Sid": "ReadTaskCode", "Effect": "Allow", "Action": "s3:GetObject",
                "Resource": shared}, owner),
        {"Sid": "TaskLogs", "Effect": "Allow",
         "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                    "logs:PutRetentionPolicy", "logs:TagResource", "logs:DescribeLogStreams",
                    "logs:GetLogEvents"],
         "Resource": [group, f"{group}:*"]},
        {"Sid": "ReadTaskSecret", "Effect": "Allow", "Action": "ssm:GetParameter",
         "Resource": f"arn:aws:ssm:{access.region}:*:parameter"
                     f"{secret_parameter(access.store_tag, access.task_id)}"},
        # Describe* calls take no resource-level permissions: "*" is the only form IAM allows.
        {"Sid": "Discover", "Effect": "Allow",
         "Action": ["ec2:DescribeInstances", "ec2:DescribeSubnets", "ec2:DescribeVpcs",
                    "ec2:DescribeInstanceTypeOfferings"],
         "Resource": "*"},
        # a replacement node mounts the task's file volumes: find their EFS file systems
        {"Sid": "FindFileVolumes", "Effect": "Allow",
         "Action": "elasticfilesystem:DescribeFileSystems",
         "Resource": "arn:aws:elasticfilesystem:*:*:file-system/*"},
        *mount_statements(access.mounts),
        *format_statements(access.block_volumes),
    ]
    if access.replacements and pins is not None:
        statements += replacement_statements(access, role_arn, pins)
    return {"Version": "2012-10-17", "Statement": statements}


def replacement_statements(access: TaskAccess, role_arn: str, pins: LaunchPins
                           ) -> list[dict[str, Any]]:
    """Replacing lost nodes, pinned to the landed gang (see the module docstring)."""
    ec2 = f"arn:aws:ec2:{pins.region}:*"
    task = {TAG_TASK: access.task_id, TAG_STORE: access.store_tag}
    referenced = [f"arn:aws:ec2:{pins.region}::image/{pins.image_id}",
                  f"{ec2}:security-group/{pins.security_group}"]
    if pins.placement_group is not None:
        referenced.append(f"{ec2}:placement-group/{pins.placement_group}")
    if pins.key_name is not None:
        referenced.append(f"{ec2}:key-pair/{pins.key_name}")
    return [
        {"Sid": "ReplaceNodesOfThisTask", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": f"{ec2}:instance/*",
         "Condition": {"StringEquals": {
             **{f"aws:RequestTag/{k}": v for k, v in task.items()},
             "aws:RequestTag/flow:role": NODE_ROLE,
             "ec2:InstanceType": pins.instance_type,
             "ec2:MetadataHttpTokens": "required"}}},
        {"Sid": "ReplacementVolumes", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": f"{ec2}:volume/*",
         "Condition": {"StringEquals": {f"aws:RequestTag/{k}": v for k, v in task.items()}}},
        {"Sid": "ReplaceFromTheGangsImageIntoItsGroups", "Effect": "Allow",
         "Action": "ec2:RunInstances", "Resource": referenced},
        {"Sid": "ReplaceInTheGangsRegion", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": [f"{ec2}:subnet/*", f"{ec2}:network-interface/*",
                      f"{ec2}:spot-instances-request/*"]},
        {"Sid": "TagOnlyAtLaunch", "Effect": "Allow", "Action": "ec2:CreateTags",
         "Resource": [f"{ec2}:instance/*", f"{ec2}:volume/*", f"{ec2}:network-interface/*",
                      f"{ec2}:spot-instances-request/*"],
         "Condition": {"StringEquals": {"ec2:CreateAction": "RunInstances"}}},
        {"Sid": "TerminateNodesOfThisTask", "Effect": "Allow",
         "Action": "ec2:TerminateInstances", "Resource": "arn:aws:ec2:*:*:instance/*",
         "Condition": {"StringEquals": {
             **{f"aws:ResourceTag/{k}": v for k, v in task.items()},
             "aws:ResourceTag/flow:role": NODE_ROLE}}},
        {"Sid": "PassThisTasksRoleToEc2", "Effect": "Allow", "Action": "iam:PassRole",
         "Resource": role_arn,
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
    ]


def policy_text(policy: dict[str, Any]) -> str:
    """The policy as IAM stores it (no whitespace, which IAM does not count)."""
    return json.dumps(policy, separators=(",", ":"))


def check_policy_size(policy: dict[str, Any], mounts: Sequence[str]) -> None:
    """Raise when the policy would pass IAM's inline-policy limit (its mounts make it
    grow)."""
    size = len(policy_text(policy))
    if size <= POLICY_LIMIT:
        return
    fix = ("mount fewer locations in mounts (a common parent prefix covers several)"
           if mounts else "shorten provider_config prefix and log_group_prefix")
    raise ProviderError(
        f"the task's node policy would be {size} characters with its {len(set(mounts))} S3 "
        f"mount(s) (mounts), over IAM's {POLICY_LIMIT}-character limit for a role's inline "
        f"policies; {fix}, or set provider_config instance_profile to a profile of your own")


def create_task_role(iam: Any, access: TaskAccess) -> str:
    """Create the task's role, its policy (without replacement rights: the gang has not
    landed) and its instance profile; returns the role's ARN. An existing role of the same
    task (a launch retried with the same id) is reused and its policy replaced."""
    if not _TASK_ID_RE.match(access.task_id):
        raise ProviderError(f"task id {access.task_id!r} cannot name IAM resources: use "
                            "letters, digits, '.', '_' and '-' only (ids from FlowApp do)")
    name = role_name(access.store_tag, access.task_id)
    path = role_path(access.store_tag)
    # the store is named by the path (a tag value could not hold a long prefix)
    tags = [{"Key": TAG_TASK, "Value": access.task_id}, {"Key": "flow:managed", "Value": "true"}]
    try:
        try:
            role_arn = str(iam.create_role(
                RoleName=name, Path=path, AssumeRolePolicyDocument=json.dumps(_TRUST),
                Description=f"flow-sdk nodes of task {access.task_id}"[:1000],
                Tags=tags)["Role"]["Arn"])
        except ClientError as exc:
            if error_code(exc) != "EntityAlreadyExists":
                raise
            role_arn = str(iam.get_role(RoleName=name)["Role"]["Arn"])
        put_task_policy(iam, access, role_arn, None)
        with tolerating("EntityAlreadyExists"):
            iam.create_instance_profile(InstanceProfileName=name, Path=path, Tags=tags)
        with tolerating("LimitExceeded"):  # the profile already holds the role
            iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    except ClientError as exc:
        raise _iam_error(name, "set up", exc) from exc
    return role_arn


def put_task_policy(iam: Any, access: TaskAccess, role_arn: str, pins: LaunchPins | None
                    ) -> None:
    """Write the task's policy (after ``check_policy_size``)."""
    policy = task_policy(access, role_arn, pins)
    check_policy_size(policy, access.mounts)
    iam.put_role_policy(RoleName=role_name(access.store_tag, access.task_id),
                        PolicyName=TASK_POLICY_NAME, PolicyDocument=policy_text(policy))


def delete_task_role(iam: Any, store_tag: str, task_id: str) -> list[str]:
    """Delete the task's instance profile, policy and role (whichever exist); returns what
    it deleted."""
    name = role_name(store_tag, task_id)
    deleted: list[str] = []
    try:
        with tolerating("NoSuchEntity"):
            iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=name)
        with tolerating("NoSuchEntity"):
            iam.delete_instance_profile(InstanceProfileName=name)
            deleted.append(f"IAM instance profile {name}")
        with tolerating("NoSuchEntity"):
            iam.delete_role_policy(RoleName=name, PolicyName=TASK_POLICY_NAME)
        with tolerating("NoSuchEntity"):
            iam.delete_role(RoleName=name)
            deleted.append(f"IAM role {name}")
    except ClientError as exc:
        raise _iam_error(name, "delete", exc) from exc
    return deleted


def task_roles(iam: Any, store_tag: str) -> dict[str, str]:
    """The store's task roles still in IAM (under its path, named for the task they are
    tagged with): role name -> task id."""
    found: dict[str, str] = {}
    for page in iam.get_paginator("list_roles").paginate(PathPrefix=role_path(store_tag)):
        for role in page["Roles"]:
            name = str(role["RoleName"])
            tags = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name)["Tags"]}
            task_id = tags.get(TAG_TASK)
            if task_id and name == role_name(store_tag, task_id):
                found[name] = str(task_id)
    return found


def _iam_error(name: str, verb: str, exc: ClientError) -> ProviderError:
    return ProviderError(f"could not {verb} the task's node role and instance profile {name!r}"
                         f": {error_code(exc)}: {error_message(exc)}; grant the IAM actions in "
                         "docs/aws-caller-policy.json on role/flow-sdk/* and "
                         "instance-profile/flow-sdk/*, or create a profile yourself and set "
                         "provider_config instance_profile (you then scope its role)")
