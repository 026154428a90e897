"""Least privilege on AWS (issue #15): each task's nodes run with a role of their own.

The policies are read back from moto's IAM as the launch wrote them and decided, request by
request, with the explicit evaluator in iam_eval.py (moto 5.2.1 has no policy simulation):
a node of task A may use its own objects, log group and nodes and nothing of task B's; a
replacement launch is allowed only as the real replacement request (built by the provider's
add_instances) makes it, pinned to A's type, image, groups and region. Mount grants live in
the task's policy and go with it, at teardown and by ``gc``.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
from aws_moto_world import (
    ACCOUNT,
    BUCKET,
    AwsWorld,
    Ec2Faults,
    Recorder,
    launch,
    launch_ids,
    node_config_of,
    spec,
)
from iam_eval import allowed, decide, like, run_instances_denials

from flow_sdk import wire
from flow_sdk.errors import CapacityError, ProviderError
from flow_sdk.wire import BootConfig, TaskRecord
from flow_sdk.providers.aws import AwsProvider
from flow_sdk.providers.aws._iam import (
    POLICY_LIMIT,
    TASK_POLICY_NAME,
    TaskAccess,
    check_policy_size,
    role_name,
    secret_parameter,
    task_policy,
)
from flow_sdk.providers.aws._launch import GangLauncher
from flow_sdk.providers.base import LaunchRequest
from flow_sdk.spec import TaskSpec

A, B = "train-a", "train-a2"  # B's id starts with A's: no prefix may cover both
DIGEST = {A: "a" * 64, B: "b" * 64}


def policy_of(world: AwsWorld, provider: AwsProvider, task_id: str) -> dict[str, Any]:
    document = world.client("iam").get_role_policy(
        RoleName=role_name(provider.store_tag, task_id),
        PolicyName=TASK_POLICY_NAME)["PolicyDocument"]
    return json.loads(document) if isinstance(document, str) else dict(document)


def role_arn(world: AwsWorld, provider: AwsProvider, task_id: str) -> str:
    return str(world.client("iam").get_role(
        RoleName=role_name(provider.store_tag, task_id))["Role"]["Arn"])


def launch_with_record(provider: AwsProvider, task_id: str, task_spec: TaskSpec,
                       digest: str) -> list[str]:
    provider.store.put(wire.task_key(task_id), wire.to_json(TaskRecord(
        task_id, task_spec.model_dump(mode="json"), digest, time.time(), 29400, 29500)))
    return [i.instance_id for i in launch(provider, task_id, task_spec, record=False)]


def obj(key: str) -> str:
    return f"arn:aws:s3:::{BUCKET}/flow/{key}"


def tags_of(world: AwsWorld, instance_id: str) -> dict[str, str]:
    [raw] = [i for i in world.instances() if i["InstanceId"] == instance_id]
    return {f"aws:ResourceTag/{t['Key']}": t["Value"] for t in raw["Tags"]}


@pytest.fixture()
def two_tasks(aws: AwsWorld, recorder: Recorder) -> dict[str, Any]:
    """Tasks A and B of one store, each with max_restarts (so replacement rights), each
    launched with its own payload; then one real replacement of A, as its deciding node's
    provider makes it."""
    provider = aws.provider()
    task_spec = spec(num_instances=2, priority="high", max_restarts=1)
    nodes = {task: launch_with_record(provider, task, task_spec, DIGEST[task])
             for task in (A, B)}
    node = aws.provider(recorder, **node_config_of(provider, nodes[A][0], "us-east-1"))
    boot = BootConfig(A, "aws", node.config(), secret="0" * 64)
    node.add_instances(LaunchRequest(A, task_spec, boot), 1)
    [replacement] = recorder.run_instances
    return {"provider": provider, "nodes": nodes, "replacement": replacement,
            "policy": {t: policy_of(aws, provider, t) for t in (A, B)}}


# -- the evaluator itself --------------------------------------------------------------------


def test_the_evaluator_decides_like_iam() -> None:
    policy = {"Statement": [
        {"Effect": "Allow", "Action": "s3:Get*", "Resource": "arn:aws:s3:::b/x/*"},
        {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/x/secret"},
        {"Effect": "Allow", "Action": "ec2:TerminateInstances", "Resource": "*",
         "Condition": {"StringEquals": {"aws:ResourceTag/t": ["1", "2"]},
                       "Null": {"aws:ResourceTag/r": "false"}}},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::b",
         "Condition": {"StringLike": {"s3:prefix": "x/?/*"}}}]}
    assert decide(policy, "S3:getobject", "arn:aws:s3:::b/x/y") == "Allow"  # case-insensitive
    assert decide(policy, "s3:GetObject", "arn:aws:s3:::b/x/secret") == "Deny"
    assert decide(policy, "s3:GetObject", "arn:aws:s3:::B/x/y") == "ImplicitDeny"
    assert decide(policy, "s3:PutObject", "arn:aws:s3:::b/x/y") == "ImplicitDeny"
    term = "ec2:TerminateInstances"
    assert allowed(policy, term, "i", {"aws:ResourceTag/t": "2", "aws:ResourceTag/r": "n"})
    assert not allowed(policy, term, "i", {"aws:ResourceTag/t": "3", "aws:ResourceTag/r": "n"})
    assert not allowed(policy, term, "i", {"aws:ResourceTag/t": "1"})  # Null: r must exist
    assert not allowed(policy, term, "i", {})  # a missing key never equals
    assert allowed(policy, "s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "x/1/z"})
    assert not allowed(policy, "s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "x/12/z"})
    assert not allowed(policy, "s3:ListBucket", "arn:aws:s3:::b")
    assert like("a*c", "abbc") and not like("a*c", "abcd") and like("a.c", "a.c")
    with pytest.raises(AssertionError, match="ArnLike"):  # never half-evaluated
        decide({"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*",
                               "Condition": {"ArnLike": {"aws:SourceArn": "x"}}}]}, "a", "r")


# -- objects, logs, nodes: A's own, never B's ----------------------------------------------------


def test_a_node_of_task_a_reaches_its_own_objects_and_not_task_bs(
        aws: AwsWorld, two_tasks: dict[str, Any]) -> None:
    provider: AwsProvider = two_tasks["provider"]
    policy = two_tasks["policy"][A]
    for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
        for key in (wire.result_key(A, 0), wire.outcome_key(A),
                    wire.membership_key(A, 1), wire.restart_key(A, 1)):
            assert allowed(policy, action, obj(key)), (action, key)
        # B's results (forged), its record and membership (rewritten), its outcome (failed)
        for key in (wire.result_key(B, 0), wire.error_key(B, 0), wire.task_key(B),
                    wire.outcome_key(B), wire.membership_key(B, 0),
                    wire.cancel_key(B), wire.payload_key(DIGEST[B])):
            assert not allowed(policy, action, obj(key)), (action, key)
        assert not allowed(policy, action, f"arn:aws:s3:::other-bucket/flow/tasks/{A}/x")
    # read-only: its own payload and the SDK wheel, never rewritten
    wheel = provider.nodes.ship_code().key
    for key in (wire.payload_key(DIGEST[A]), wheel):
        assert allowed(policy, "s3:GetObject", obj(key))
        assert not allowed(policy, "s3:PutObject", obj(key))
        assert not allowed(policy, "s3:DeleteObject", obj(key))
    assert not allowed(policy, "s3:PutObject", obj("code/" + "0" * 64 + ".whl"))
    # listing: under its own folder only
    bucket = f"arn:aws:s3:::{BUCKET}"
    assert allowed(policy, "s3:ListBucket", bucket, {"s3:prefix": f"flow/tasks/{A}/restarts/"})
    for prefix in (f"flow/tasks/{B}/", f"flow/tasks/{A}", "flow/tasks/", "flow/", ""):
        assert not allowed(policy, "s3:ListBucket", bucket, {"s3:prefix": prefix}), prefix
    assert not allowed(policy, "s3:ListBucket", bucket)
    # B's policy mirrors it
    assert allowed(two_tasks["policy"][B], "s3:PutObject", obj(wire.result_key(B, 0)))
    assert not allowed(two_tasks["policy"][B], "s3:PutObject", obj(wire.result_key(A, 0)))


def test_a_node_of_task_a_writes_its_own_log_group_only(two_tasks: dict[str, Any]) -> None:
    policy = two_tasks["policy"][A]
    logs = f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:"
    for action in ("logs:CreateLogGroup", "logs:PutRetentionPolicy"):
        assert allowed(policy, action, f"{logs}/flow/{A}")
        assert not allowed(policy, action, f"{logs}/flow/{B}")
    for action in ("logs:CreateLogStream", "logs:PutLogEvents", "logs:GetLogEvents"):
        assert allowed(policy, action, f"{logs}/flow/{A}:log-stream:node-0.rank-0")
        assert not allowed(policy, action, f"{logs}/flow/{B}:log-stream:node-0.rank-0")
    assert not allowed(policy, "logs:DeleteLogGroup", f"{logs}/flow/{A}")


def test_a_node_of_task_a_reads_its_own_secret_only(two_tasks: dict[str, Any]) -> None:
    """The secret is not in user-data: each task's role reads its own SSM parameter, and
    nothing else of SSM."""
    store_tag = two_tasks["provider"].store_tag
    ssm = f"arn:aws:ssm:us-east-1:{ACCOUNT}:parameter"
    own, other = (ssm + secret_parameter(store_tag, t) for t in (A, B))
    assert allowed(two_tasks["policy"][A], "ssm:GetParameter", own)
    assert not allowed(two_tasks["policy"][A], "ssm:GetParameter", other)
    assert allowed(two_tasks["policy"][B], "ssm:GetParameter", other)
    for action in ("ssm:PutParameter", "ssm:DeleteParameter", "ssm:GetParametersByPath"):
        assert not allowed(two_tasks["policy"][A], action, own)
    elsewhere = f"arn:aws:ssm:us-west-2:{ACCOUNT}:parameter{secret_parameter(store_tag, A)}"
    assert not allowed(two_tasks["policy"][A], "ssm:GetParameter", elsewhere)


def test_a_node_of_task_a_terminates_its_own_nodes_and_not_task_bs(
        aws: AwsWorld, two_tasks: dict[str, Any]) -> None:
    policy = two_tasks["policy"][A]
    term = "ec2:TerminateInstances"

    def arn(instance_id: str) -> str:
        return f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/{instance_id}"

    for instance_id in two_tasks["nodes"][A]:
        assert allowed(policy, term, arn(instance_id), tags_of(aws, instance_id))
    for instance_id in two_tasks["nodes"][B]:
        assert not allowed(policy, term, arn(instance_id), tags_of(aws, instance_id))
        assert allowed(two_tasks["policy"][B], term, arn(instance_id), tags_of(aws, instance_id))
    assert not allowed(policy, term, arn("i-0123456789abcdef0"), {})  # untagged: not flow's


def test_replacement_launches_are_pinned_to_the_gang(aws: AwsWorld,
                                                     two_tasks: dict[str, Any]) -> None:
    request = two_tasks["replacement"]  # the request A's deciding node really sends
    own, other = two_tasks["policy"][A], two_tasks["policy"][B]
    assert run_instances_denials(own, request, "us-east-1", ACCOUNT) == []
    assert run_instances_denials(other, request, "us-east-1", ACCOUNT) != []
    # whatever else a node of A might ask for is refused
    b_group = next(i for i in aws.instances() if i["InstanceId"] == two_tasks["nodes"][B][0])[
        "SecurityGroups"][0]["GroupId"]

    def forged(**changes: Any) -> dict[str, Any]:
        changed = copy.deepcopy(request)
        changed.update(changes)
        return changed

    def retagged(task: str) -> list[dict[str, Any]]:
        return [{"ResourceType": s["ResourceType"],
                 "Tags": [{"Key": t["Key"], "Value": task if t["Key"] == "flow:task-id"
                           else t["Value"]} for t in s["Tags"]]}
                for s in request["TagSpecifications"]]

    refused = {
        "another type": forged(InstanceType="p5.48xlarge"),
        "another image": forged(ImageId="ami-0badbadbadbadbad0"),
        "B's security group": forged(SecurityGroupIds=[b_group]),
        "B's key pair": forged(KeyName=f"flow-{B}"),
        "tagged as B's": forged(TagSpecifications=retagged(B)),
        "untagged": forged(TagSpecifications=[]),
        "IMDSv1": forged(MetadataOptions={"HttpTokens": "optional", "HttpEndpoint": "enabled"}),
    }
    for what, attempt in refused.items():
        assert run_instances_denials(own, attempt, "us-east-1", ACCOUNT) != [], what
    assert run_instances_denials(own, request, "us-west-2", ACCOUNT) != []  # another region
    # tags only as part of that launch; the role passed only its own, only to EC2
    ec2 = f"arn:aws:ec2:us-east-1:{ACCOUNT}"
    assert allowed(own, "ec2:CreateTags", f"{ec2}:instance/i-1",
                   {"ec2:CreateAction": "RunInstances"})
    assert not allowed(own, "ec2:CreateTags", f"{ec2}:instance/i-1")
    provider = two_tasks["provider"]
    passed = {"iam:PassedToService": "ec2.amazonaws.com"}
    assert allowed(own, "iam:PassRole", role_arn(aws, provider, A), passed)
    assert not allowed(own, "iam:PassRole", role_arn(aws, provider, B), passed)
    assert not allowed(own, "iam:PassRole", role_arn(aws, provider, A),
                       {"iam:PassedToService": "lambda.amazonaws.com"})


def test_the_policy_grants_only_what_nodes_call(two_tasks: dict[str, Any]) -> None:
    policy = two_tasks["policy"][A]
    statements = policy["Statement"]
    assert all(s["Effect"] == "Allow" for s in statements)
    actions = sorted({a for s in statements for a in
                      ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])})
    assert actions == sorted([
        "s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket",
        "logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
        "logs:PutRetentionPolicy", "logs:TagResource", "logs:DescribeLogStreams",
        "logs:GetLogEvents", "ec2:DescribeInstances", "ec2:DescribeSubnets",
        "ec2:DescribeVpcs", "ec2:DescribeInstanceTypeOfferings",
        "elasticfilesystem:DescribeFileSystems", "ec2:RunInstances", "ec2:CreateTags",
        "ec2:TerminateInstances", "iam:PassRole", "ssm:GetParameter"])
    for statement in statements:  # "*" only where IAM allows nothing narrower
        resources = statement["Resource"]
        if "*" in ([resources] if isinstance(resources, str) else resources):
            assert all(a.startswith("ec2:Describe") for a in statement["Action"])


def test_a_task_without_max_restarts_may_neither_launch_nor_terminate(aws: AwsWorld) -> None:
    provider = aws.provider()
    [node] = launch_with_record(provider, "once-1", spec(num_instances=1, priority="high"),
                                DIGEST[A])
    policy = policy_of(aws, provider, "once-1")
    text = json.dumps(policy)
    assert "RunInstances" not in text and "TerminateInstances" not in text
    assert "PassRole" not in text and "CreateTags" not in text
    assert not allowed(policy, "ec2:TerminateInstances",
                       f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/{node}", tags_of(aws, node))


# -- mount grants: per task, gone with it ------------------------------------------------------


def _mount_grants(policy: dict[str, Any]) -> list[str]:
    return [r for s in policy["Statement"] if "Mount" in s["Sid"]
            for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])]


def test_mount_grants_are_per_task_and_removed_at_teardown(aws: AwsWorld) -> None:
    provider = aws.provider()
    launch_ids(provider, "m-1", spec(num_instances=1, priority="high",
                                     mounts={"/data": "s3://datasets/imagenet"}))
    launch_ids(provider, "m-2", spec(num_instances=1, priority="high"))
    own, other = policy_of(aws, provider, "m-1"), policy_of(aws, provider, "m-2")
    assert allowed(own, "s3:GetObject", "arn:aws:s3:::datasets/imagenet/x.jpg")
    assert not allowed(own, "s3:PutObject", "arn:aws:s3:::datasets/imagenet/x.jpg")
    assert not allowed(own, "s3:GetObject", "arn:aws:s3:::datasets/other/x.jpg")
    assert _mount_grants(other) == []  # a later task cannot read an earlier task's mounts
    assert not allowed(other, "s3:GetObject", "arn:aws:s3:::datasets/imagenet/x.jpg")
    provider.terminate("m-1")
    iam = aws.client("iam")
    with pytest.raises(iam.exceptions.NoSuchEntityException):
        iam.get_role(RoleName=role_name(provider.store_tag, "m-1"))
    with pytest.raises(iam.exceptions.NoSuchEntityException):
        iam.get_instance_profile(InstanceProfileName=role_name(provider.store_tag, "m-1"))
    assert [r["RoleName"] for r in iam.list_roles()["Roles"]] == [
        role_name(provider.store_tag, "m-2")]
    provider.terminate("m-2")
    assert iam.list_roles()["Roles"] == [] and iam.list_instance_profiles()[
        "InstanceProfiles"] == []


def test_gc_removes_the_roles_and_mount_grants_of_ended_tasks_only(aws: AwsWorld) -> None:
    provider = aws.provider()
    mounts = {"/data": "s3://datasets/imagenet"}
    for task in ("gc-ended", "gc-live"):
        launch_ids(provider, task, spec(num_instances=1, priority="high", mounts=mounts))
    judged = {"gc-ended": "task ended SUCCEEDED"}  # what lifecycle passes, having checked
    ended, live = (role_name(provider.store_tag, t) for t in ("gc-ended", "gc-live"))
    iam = aws.client("iam")

    dry = provider.gc(dry_run=True, ended=judged)
    assert f"IAM role {ended} (task gc-ended)" in dry.deleted
    assert {r["RoleName"] for r in iam.list_roles()["Roles"]} == {ended, live}

    report = provider.gc(ended=judged)
    assert {f"IAM role {ended}", f"IAM instance profile {ended}"} <= set(report.deleted)
    assert "gc-live" in report.live_tasks and "gc-ended" in report.reasons
    assert [r["RoleName"] for r in iam.list_roles()["Roles"]] == [live]
    assert _mount_grants(policy_of(aws, provider, "gc-live")) != []  # the live task keeps its
    # another store's task roles are never touched
    other = aws.provider(prefix="other/")
    launch_ids(other, "gc-other", spec(num_instances=1, priority="high"), record=False)
    provider.gc()
    assert role_name(other.store_tag, "gc-other") in {
        r["RoleName"] for r in iam.list_roles()["Roles"]}
    for task in ("gc-live",):
        provider.terminate(task)
    other.terminate("gc-other")


def test_a_failed_launch_leaves_no_role(aws: AwsWorld, ec2_faults: Ec2Faults) -> None:
    ec2_faults.capacity()
    provider = aws.provider()
    with pytest.raises(CapacityError):
        launch_ids(provider, "fail-1", spec(num_instances=1, priority="high"))
    iam = aws.client("iam")
    assert iam.list_roles()["Roles"] == [] and iam.list_instance_profiles()[
        "InstanceProfiles"] == []
    assert not [p for p in aws.client("ssm").describe_parameters()["Parameters"]
                if p["Name"].startswith("/flow-sdk/")]  # nor its secret


def test_an_interrupted_launch_leaves_no_role(aws: AwsWorld,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(GangLauncher, "try_launch", interrupted)
    provider = aws.provider()
    with pytest.raises(KeyboardInterrupt):
        launch_ids(provider, "int-1", spec(num_instances=1, priority="high"))
    assert aws.client("iam").list_roles()["Roles"] == []


# -- IAM's limits: policy size, profile propagation --------------------------------------------


def many_mounts(count: int) -> dict[str, str]:
    return {f"/data/{i}": f"s3://datasets-{i:03d}/imagenet/train/shard-{i:03d}"
            for i in range(count)}


def test_the_policy_size_is_checked_before_launch_naming_mounts(aws: AwsWorld) -> None:
    provider = aws.provider()
    # 20 mounts in 20 buckets fit in each task's own policy (a store-wide policy once
    # collected every task's mounts and broke every launch near 21)
    assert provider.check(spec(num_instances=1, priority="high", max_restarts=1,
                               mounts=many_mounts(20))) == []
    [problem] = provider.check(spec(num_instances=1, priority="high", mounts=many_mounts(200)))
    assert problem.field == "mounts" and "10240" in problem.message
    with pytest.raises(ProviderError, match=r"mounts"):  # a launch not checked first
        launch_ids(provider, "big-1", spec(num_instances=1, priority="high",
                                           mounts=many_mounts(200)))
    assert aws.non_terminated() == [] and aws.client("iam").list_roles()["Roles"] == []
    # with a profile of the user's own nothing is generated, so nothing is limited
    named = aws.provider(instance_profile="my-profile")
    assert named.check(spec(num_instances=1, priority="high", mounts=many_mounts(200))) == []


def test_check_policy_size_counts_what_iam_counts() -> None:
    access = TaskAccess("t", "b", "flow/", "s3://b/flow/", "us-east-1", "/flow/t", "code/x.whl",
                        None, None, tuple(f"s3://b{i:03d}/p" for i in range(300)))
    policy = task_policy(access, "arn:aws:iam::1:role/r")
    assert len(json.dumps(policy, separators=(",", ":"))) > POLICY_LIMIT
    with pytest.raises(ProviderError, match="mounts"):
        check_policy_size(policy, access.mounts)


def test_a_new_profile_that_ec2_does_not_see_yet_is_retried(
        aws: AwsWorld, ec2_faults: Ec2Faults, recorder: Recorder) -> None:
    ec2_faults.profile_not_ready(times=3)
    provider = aws.provider(recorder)
    assert len(launch_ids(provider, "prop-1", spec(num_instances=1, priority="high"))) == 1
    assert recorder.count("ec2.RunInstances") == 4  # 3 refusals, then the same request
    provider.terminate("prop-1")


def test_a_profile_that_never_propagates_fails_the_launch_cleanly(
        aws: AwsWorld, ec2_faults: Ec2Faults) -> None:
    ec2_faults.profile_not_ready(times=None)
    provider = aws.provider()
    with pytest.raises(ProviderError, match="still refused the task's new instance profile"):
        launch_ids(provider, "prop-2", spec(num_instances=1, priority="high"))
    assert aws.non_terminated() == [] and aws.client("iam").list_roles()["Roles"] == []


# -- a profile the user names ---------------------------------------------------------------


def test_a_user_named_instance_profile_is_used_as_is(aws: AwsWorld, recorder: Recorder
                                                     ) -> None:
    iam = aws.client("iam")
    iam.create_instance_profile(InstanceProfileName="my-profile")
    provider = aws.provider(recorder, instance_profile="my-profile")
    launch_ids(provider, "own-1", spec(num_instances=1, priority="high", max_restarts=1,
                                       mounts={"/d": "s3://datasets/x"}))
    [sent] = recorder.run_instances
    assert sent["IamInstanceProfile"] == {"Name": "my-profile"}
    assert not any(call.startswith("iam.") for call in recorder.calls)
    provider.gc(ended={"own-1": "task ended SUCCEEDED"})
    provider.terminate("own-1")
    assert not any(call.startswith("iam.") for call in recorder.calls)  # the user's to scope
    assert [p["InstanceProfileName"] for p in iam.list_instance_profiles()[
        "InstanceProfiles"]] == ["my-profile"]


def test_a_pools_role_reaches_the_pool_and_its_tasks_and_nothing_of_another_pool() -> None:
    """A pool's nodes run every task of the pool: its role is scoped to the pool's id, which
    every task of the pool starts its own id with."""
    pool, other = "dev-20261125-010203-abc123", "dev-20261125-010203-abc124"
    task = f"{pool}.train-20261125-010300-def456"
    access = TaskAccess(task_id=pool, bucket=BUCKET, prefix="flow/", store_tag="s3://b/flow/",
                        region="us-east-1", log_group=f"/flow/{pool}", code_key="code/x.whl",
                        payload_digest=None, bucket_owner=None, replacements=True,
                        pool=True)
    policy = task_policy(access, f"arn:aws:iam::{ACCOUNT}:role/r")
    for key in (wire.task_key(task), wire.result_key(task, 0), wire.payload_key("a" * 64, pool),
                f"tasks/{pool}/pool.json", f"tasks/{pool}/assign/i-1/00000000.json"):
        assert allowed(policy, "s3:GetObject", obj(key)), key
        assert allowed(policy, "s3:PutObject", obj(key)), key
    for key in (wire.task_key(f"{other}.t-1"), f"tasks/{other}/pool.json",
                wire.task_key("train-20261125-010300-def456"), wire.payload_key("a" * 64)):
        assert not allowed(policy, "s3:GetObject", obj(key)), key
    bucket = f"arn:aws:s3:::{BUCKET}"
    assert allowed(policy, "s3:ListBucket", bucket, {"s3:prefix": f"flow/tasks/{task}/"})
    assert not allowed(policy, "s3:ListBucket", bucket, {"s3:prefix": f"flow/tasks/{other}/"})
    logs = f"arn:aws:logs:us-east-1:{ACCOUNT}:log-group:"
    assert allowed(policy, "logs:PutLogEvents", f"{logs}/flow/{task}:log-stream:node-0.rank-0")
    assert not allowed(policy, "logs:PutLogEvents", f"{logs}/flow/{other}:log-stream:x")
