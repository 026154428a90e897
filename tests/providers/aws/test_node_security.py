"""Security of the nodes (issue #8): the instance profile's policy is least-privilege, SSH is
never open to the internet, spot interruption notices are read over IMDSv2 only, and the
user-data size is checked before launch. (No secrets in user-data, logs or objects of a
whole simulated run: test_simulated_cloud.py.)"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from aws_moto_world import BUCKET, AwsWorld, spec

from flow_sdk.errors import ProviderError
from flow_sdk.protocol import BootConfig
from flow_sdk.providers.aws import AwsProvider
from flow_sdk.providers.aws._config import check_ssh_cidr
from flow_sdk.providers.aws._imds import SPOT_ACTION_PATH, TOKEN_HEADER, TTL_HEADER
from flow_sdk.providers.aws._iam import NODE_POLICY_NAME, node_policy
from fake_imds import FakeImds
from flow_sdk.providers.base import LaunchRequest

STORE = f"s3://{BUCKET}/flow/"
ROLE = "arn:aws:iam::123456789012:role/flow-sdk-node-abc"


def statements(policy: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["Sid"]: s for s in policy["Statement"]}


def as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


# -- the nodes' IAM policy -------------------------------------------------------------------


def test_node_policy_grants_only_what_nodes_call() -> None:
    policy = node_policy(BUCKET, "flow/", "/flow/", STORE, ROLE)
    assert all(s["Effect"] == "Allow" for s in policy["Statement"])
    actions = sorted(a for s in policy["Statement"] for a in as_list(s["Action"]))
    assert actions == sorted([
        "s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket",
        "logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",
        "logs:PutRetentionPolicy", "logs:TagResource", "logs:DescribeLogStreams",
        "logs:GetLogEvents",
        "ec2:DescribeInstances", "ec2:DescribeSubnets", "ec2:DescribeVpcs",
        "ec2:DescribeInstanceTypeOfferings", "elasticfilesystem:DescribeFileSystems",
        "ec2:RunInstances", "ec2:RunInstances", "ec2:RunInstances", "ec2:RunInstances",
        "ec2:CreateTags", "ec2:TerminateInstances", "iam:PassRole"])
    assert not any("*" in a for a in actions)  # no wildcard actions
    # "*" resources only where IAM allows nothing narrower (Describe* calls)
    for statement in policy["Statement"]:
        if "*" in as_list(statement["Resource"]):
            assert all(a.startswith("ec2:Describe") for a in as_list(statement["Action"]))
    by_sid = statements(policy)
    assert by_sid["TaskObjects"]["Resource"] == f"arn:aws:s3:::{BUCKET}/flow/*"
    assert by_sid["TaskLogs"]["Resource"] == "arn:aws:logs:*:*:log-group:/flow/*"

    # new instances only with this store's tags, the node role and a task id
    launch = by_sid["LaunchNodesOfThisStore"]
    assert launch["Resource"] == "arn:aws:ec2:*:*:instance/*"
    assert launch["Condition"] == {
        "StringEquals": {"aws:RequestTag/flow:store": STORE, "aws:RequestTag/flow:role": "node"},
        "Null": {"aws:RequestTag/flow:task-id": "false"}}
    assert by_sid["LaunchVolumesOfThisStore"]["Condition"]["StringEquals"] == {
        "aws:RequestTag/flow:store": STORE}
    assert by_sid["LaunchIntoThisStoresGroups"]["Condition"] == {
        "StringEquals": {"aws:ResourceTag/flow:store": STORE}}
    # the unconditioned launch statement covers only what a launch references, never an
    # instance or volume
    assert not any("instance/" in r or "volume/" in r
                   for r in as_list(by_sid["LaunchWith"]["Resource"]))
    # tags only as part of RunInstances; terminate only this store's nodes
    assert by_sid["TagOnlyAtLaunch"]["Condition"] == {
        "StringEquals": {"ec2:CreateAction": "RunInstances"}}
    assert by_sid["TerminateNodesOfThisStore"]["Condition"] == {
        "StringEquals": {"aws:ResourceTag/flow:store": STORE, "aws:ResourceTag/flow:role": "node"}}
    # PassRole: the node role itself, to EC2 only
    assert by_sid["PassTheNodeRoleToEc2"]["Resource"] == ROLE
    assert by_sid["PassTheNodeRoleToEc2"]["Condition"] == {
        "StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}


def test_an_older_profile_policy_is_brought_up_to_date(aws: AwsWorld) -> None:
    provider = aws.provider()
    name, _created = provider.nodes.instance_profile()
    iam = aws.client("iam")
    old = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "ec2:DescribeInstances", "Resource": "*"}]}
    iam.put_role_policy(RoleName=name, PolicyName=NODE_POLICY_NAME,
                        PolicyDocument=json.dumps(old))
    again = aws.provider()
    assert again.nodes.instance_profile() == (name, False)  # exists: not created again
    role_arn = iam.get_role(RoleName=name)["Role"]["Arn"]
    current = iam.get_role_policy(RoleName=name, PolicyName=NODE_POLICY_NAME)
    assert current["PolicyDocument"] == node_policy(BUCKET, "flow/", "/flow/", STORE, role_arn)


# -- SSH never open to the internet ----------------------------------------------------------


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0", "10.0.0.0/8", "2001:db8::/32"])
def test_ssh_is_never_open_to_the_internet(aws: AwsWorld, cidr: str) -> None:
    with pytest.raises(ProviderError, match="would open SSH"):
        check_ssh_cidr(cidr)
    with pytest.raises(ProviderError, match="would open SSH"):
        AwsProvider.from_config(aws.config(ssh_cidr=cidr))


def test_the_callers_address_or_network_is_accepted() -> None:
    assert check_ssh_cidr("203.0.113.7/32") == "203.0.113.7/32"
    assert check_ssh_cidr("198.51.100.0/24") == "198.51.100.0/24"
    assert check_ssh_cidr("2001:db8:1:2::/64") == "2001:db8:1:2::/64"


# -- spot interruption notices over IMDSv2 -----------------------------------------------------


@pytest.fixture()
def imds() -> Any:
    server = FakeImds().start()
    yield server
    server.stop()


def test_the_fake_imds_requires_a_token(imds: FakeImds) -> None:
    url = imds.endpoint + SPOT_ACTION_PATH
    with pytest.raises(urllib.error.HTTPError) as caught:  # IMDSv1 style: refused
        urllib.request.urlopen(url, timeout=5)
    assert caught.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(urllib.request.Request(url, headers={TOKEN_HEADER: "forged"}),
                               timeout=5)
    assert bad.value.code == 401
    token = urllib.request.urlopen(urllib.request.Request(
        imds.endpoint + "/latest/api/token", method="PUT", headers={TTL_HEADER: "60"}),
        timeout=5).read().decode()
    with pytest.raises(urllib.error.HTTPError) as none:
        urllib.request.urlopen(urllib.request.Request(url, headers={TOKEN_HEADER: token}),
                               timeout=5)
    assert none.value.code == 404  # a token, but no notice


def test_interruption_notice_reads_imdsv2_with_one_cached_token(aws: AwsWorld,
                                                               imds: FakeImds) -> None:
    provider = aws.provider(imds_endpoint=imds.endpoint)
    assert provider.interruption_notice("i-1") is None  # 404: no notice
    for _ in range(9):
        assert provider.interruption_notice("i-1") is None
    notice = imds.interrupt()
    assert provider.interruption_notice("i-1") == notice
    assert json.loads(notice)["action"] == "terminate"
    methods = [m for m, _path, _status in imds.requests]
    assert methods.count("PUT") == 1 and methods.count("GET") == 11  # one token, cached
    assert all(status != 401 for _m, _p, status in imds.requests)

    imds.revoke_tokens()  # the token expired, or IMDS restarted: one retry with a new one
    assert provider.interruption_notice("i-1") == notice
    assert [s for _m, _p, s in imds.requests[-3:]] == [401, 200, 200]

    started = time.monotonic()
    for _ in range(20):  # cheap to poll: one local GET per call
        provider.interruption_notice("i-1")
    assert time.monotonic() - started < 5.0


def test_each_simulated_node_reads_its_own_metadata(aws: AwsWorld, imds: FakeImds) -> None:
    provider = aws.provider(imds_endpoint=imds.endpoint + "/{instance_id}",
                            simulate={"root": str(aws.sim_root)})
    notice = imds.interrupt("i-0b")
    assert provider.interruption_notice("i-0a") is None
    assert provider.interruption_notice("i-0b") == notice
    assert {path.split("/")[1] for _m, path, _s in imds.requests} == {"i-0a", "i-0b"}
    # a simulated cloud with no imds_endpoint has no metadata service: never a notice, and
    # never a connection attempt (this process may reach 127.0.0.0/8 only)
    bare = aws.provider(simulate={"root": str(aws.sim_root)})
    assert bare.interruption_notice("i-0a") is None


def test_an_unreachable_imds_is_a_provider_error(aws: AwsWorld, imds: FakeImds) -> None:
    endpoint = imds.endpoint
    imds.stop()
    provider = aws.provider(imds_endpoint=endpoint)
    started = time.monotonic()
    with pytest.raises(ProviderError, match="instance metadata service .* did not answer"):
        provider.interruption_notice("i-1")
    assert time.monotonic() - started < 5.0
    with pytest.raises(ProviderError, match="imds_endpoint"):
        aws.provider(imds_endpoint="file:///etc/passwd")


# -- the user-data size, before launch --------------------------------------------------------


def test_user_data_over_the_ec2_limit_is_found_by_check(aws: AwsWorld) -> None:
    provider = aws.provider(prefix="p" * 17000 + "/")
    problems = provider.check(spec(priority="high"))
    assert [p.field for p in problems] == ["provider_config"]
    assert "16384-byte user-data limit" in problems[0].message
    assert aws.provider().check(spec(priority="high")) == []
    boot = BootConfig("big-1", "aws", provider.config()).to_env()
    with pytest.raises(ProviderError, match="user-data limit"):
        provider.launch(LaunchRequest("big-1", spec(priority="high"), boot))
    assert aws.non_terminated() == []
