"""The nodes' IAM: the instance profile every node of this store runs with, and its policy
(its store's objects and log groups, discovery, replacing lost nodes, and read-only grants for
a task's S3 mounts), created when missing and brought up to date."""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from collections.abc import Sequence
from typing import Any

from botocore.exceptions import ClientError

from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws._clients import Clients, error_code, error_message, tolerating
from flow_sdk.providers.aws._config import AwsConfig
from flow_sdk.providers.aws._resources import NODE_ROLE
from flow_sdk.s3uri import folder_prefix, split_s3_uri

NODE_POLICY_NAME = "flow-sdk-node"
MOUNT_SID_PREFIX = "ReadMount"


def mount_statements(mounts: Sequence[str]) -> list[dict[str, Any]]:
    """Read-only access for the task's S3 mounts (``s3://bucket/prefix``): ``s3:ListBucket`` on
    each bucket, limited to the prefix, and ``s3:GetObject`` on the prefix's objects only."""
    statements: list[dict[str, Any]] = []
    for uri in sorted(set(mounts)):
        bucket, key = split_s3_uri(uri)
        prefix = folder_prefix(key)
        sid = MOUNT_SID_PREFIX + hashlib.sha256(f"s3://{bucket}/{prefix}".encode()).hexdigest()[:12]
        listing: dict[str, Any] = {"Sid": f"{sid}List", "Effect": "Allow",
                                   "Action": "s3:ListBucket",
                                   "Resource": f"arn:aws:s3:::{bucket}"}
        if prefix:
            listing["Condition"] = {"StringLike": {"s3:prefix": f"{prefix}*"}}
        statements.append(listing)
        statements.append({"Sid": f"{sid}Get", "Effect": "Allow", "Action": "s3:GetObject",
                           "Resource": f"arn:aws:s3:::{bucket}/{prefix}*"})
    return statements


def node_policy(bucket: str, prefix: str, log_group_prefix: str, store_tag: str,
                role_arn: str, mounts: Sequence[str] = ()) -> dict[str, Any]:
    """What a node may do, and nothing more.

    * its store's objects and log groups, and describing instances (discovery);
    * replacing lost nodes under ``max_restarts`` (the decider node calls ``add_instances``
      and ``terminate_instances``): RunInstances only for instances and volumes tagged with
      this store, the node role and a task id, into this store's security and placement
      groups; tags only as part of that launch; TerminateInstances only on this store's
      nodes; iam:PassRole only for the node role itself, only to EC2.

    One role serves every task of a store, and an instance profile's credentials carry no tag
    of the instance they run on, so IAM cannot tell tasks apart here: the limit is this
    store's nodes (tag ``flow:store``). The provider itself terminates only the named
    instances of the calling task.
    """
    ec2 = "arn:aws:ec2:*:*"
    store = {"aws:ResourceTag/flow:store": store_tag}
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "TaskObjects", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
         "Resource": f"arn:aws:s3:::{bucket}/{prefix}*"},
        {"Sid": "ListTaskObjects", "Effect": "Allow", "Action": "s3:ListBucket",
         "Resource": f"arn:aws:s3:::{bucket}",
         "Condition": {"StringLike": {"s3:prefix": f"{prefix}*"}}},
        {"Sid": "TaskLogs", "Effect": "Allow",
         "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
                    "logs:PutRetentionPolicy", "logs:TagResource", "logs:DescribeLogStreams",
                    "logs:GetLogEvents"],
         "Resource": f"arn:aws:logs:*:*:log-group:{log_group_prefix}*"},
        # Describe* calls take no resource-level permissions: "*" is the only form IAM allows.
        {"Sid": "Discover", "Effect": "Allow",
         "Action": ["ec2:DescribeInstances", "ec2:DescribeSubnets", "ec2:DescribeVpcs",
                    "ec2:DescribeInstanceTypeOfferings"],
         "Resource": "*"},
        # a replacement node mounts the task's file volumes: find their EFS file systems
        {"Sid": "FindFileVolumes", "Effect": "Allow",
         "Action": "elasticfilesystem:DescribeFileSystems",
         "Resource": "arn:aws:elasticfilesystem:*:*:file-system/*"},
        {"Sid": "LaunchNodesOfThisStore", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": f"{ec2}:instance/*",
         "Condition": {"StringEquals": {"aws:RequestTag/flow:store": store_tag,
                                        "aws:RequestTag/flow:role": NODE_ROLE},
                       "Null": {"aws:RequestTag/flow:task-id": "false"}}},
        {"Sid": "LaunchVolumesOfThisStore", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": f"{ec2}:volume/*",
         "Condition": {"StringEquals": {"aws:RequestTag/flow:store": store_tag},
                       "Null": {"aws:RequestTag/flow:task-id": "false"}}},
        {"Sid": "LaunchIntoThisStoresGroups", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": [f"{ec2}:security-group/*", f"{ec2}:placement-group/*"],
         "Condition": {"StringEquals": store}},
        {"Sid": "LaunchWith", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": ["arn:aws:ec2:*::image/*", f"{ec2}:subnet/*",
                      f"{ec2}:network-interface/*", f"{ec2}:key-pair/*",
                      f"{ec2}:spot-instances-request/*"]},
        {"Sid": "TagOnlyAtLaunch", "Effect": "Allow", "Action": "ec2:CreateTags",
         "Resource": [f"{ec2}:instance/*", f"{ec2}:volume/*", f"{ec2}:network-interface/*",
                      f"{ec2}:spot-instances-request/*"],
         "Condition": {"StringEquals": {"ec2:CreateAction": "RunInstances"}}},
        {"Sid": "TerminateNodesOfThisStore", "Effect": "Allow",
         "Action": "ec2:TerminateInstances", "Resource": f"{ec2}:instance/*",
         "Condition": {"StringEquals": {**store, "aws:ResourceTag/flow:role": NODE_ROLE}}},
        {"Sid": "PassTheNodeRoleToEc2", "Effect": "Allow", "Action": "iam:PassRole",
         "Resource": role_arn,
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
        *mount_statements(mounts),
    ]}


_TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
    "Action": "sts:AssumeRole"}]}


def ensure_instance_profile(clients: Clients, config: AwsConfig, bucket: str, store_tag: str,
                            mounts: Sequence[str] = ()) -> tuple[str, bool]:
    """The nodes' instance profile name, and whether this call created it (a new profile
    takes a few seconds to become usable by run_instances). An existing flow-managed profile
    whose policy differs from ``node_policy`` (an older flow-sdk's) gets the current one.

    ``mounts`` (a task's S3 mount URIs) add read-only grants; one role serves every task of a
    store, so grants for mounts of earlier tasks are kept (tasks may still be running)."""
    if config.instance_profile is not None:
        return config.instance_profile, False
    digest = hashlib.sha256(f"{bucket}/{config.prefix}".encode()).hexdigest()[:10]
    name = f"flow-sdk-node-{digest}"
    iam = clients.get("iam", config.region)

    def policy(role_arn: str, current: Any = None) -> dict[str, Any]:
        wanted = node_policy(bucket, config.prefix, config.log_group_prefix, store_tag,
                             role_arn, mounts)
        if isinstance(current, dict):
            have = {s.get("Sid") for s in wanted["Statement"]}
            wanted["Statement"].extend(
                s for s in current.get("Statement", [])
                if isinstance(s, dict) and str(s.get("Sid", "")).startswith(MOUNT_SID_PREFIX)
                and s.get("Sid") not in have)
        return wanted

    try:
        try:
            roles = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Roles"]
        except ClientError as exc:
            if error_code(exc) != "NoSuchEntity":
                raise
            roles = []
        if roles:
            try:
                current = iam.get_role_policy(RoleName=name, PolicyName=NODE_POLICY_NAME)
            except ClientError as exc:
                if error_code(exc) != "NoSuchEntity":
                    raise
                current = {}
            document = _policy_document(current.get("PolicyDocument"))
            wanted = policy(str(roles[0]["Arn"]), document)
            if document != wanted:
                iam.put_role_policy(RoleName=name, PolicyName=NODE_POLICY_NAME,
                                    PolicyDocument=json.dumps(wanted))
            return name, False
        try:
            role_arn = iam.create_role(
                RoleName=name, AssumeRolePolicyDocument=json.dumps(_TRUST),
                Description="flow-sdk nodes: task objects, task logs, discovery, replacement",
                Tags=[{"Key": "flow:managed", "Value": "true"}])["Role"]["Arn"]
        except ClientError as exc:
            if error_code(exc) != "EntityAlreadyExists":
                raise
            role_arn = iam.get_role(RoleName=name)["Role"]["Arn"]
        iam.put_role_policy(RoleName=name, PolicyName=NODE_POLICY_NAME,
                            PolicyDocument=json.dumps(policy(str(role_arn))))
        with tolerating("EntityAlreadyExists"):
            iam.create_instance_profile(InstanceProfileName=name)
        with tolerating("LimitExceeded"):  # the profile already holds the role
            iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    except ClientError as exc:
        raise _iam_error(name, exc) from exc
    return name, True


def _policy_document(value: Any) -> Any:
    """A role policy as get_role_policy returns it (a dict, or URL-encoded JSON text)."""
    if isinstance(value, str):
        return json.loads(urllib.parse.unquote(value))
    return value


def _iam_error(name: str, exc: ClientError) -> ProviderError:
    return ProviderError(f"could not set up the nodes' instance profile {name!r}: "
                         f"{error_code(exc)}: {error_message(exc)}; grant iam:CreateRole, "
                         "iam:PutRolePolicy, iam:CreateInstanceProfile, "
                         "iam:AddRoleToInstanceProfile, iam:GetRolePolicy and iam:PassRole, or "
                         "create a profile yourself and set provider_config instance_profile "
                         "(its role needs what flow_sdk.providers.aws._resources.node_policy "
                         "grants)")
