"""Security of the nodes (issue #8): SSH is never open to the internet, spot interruption
notices are read over IMDSv2 only, and the user-data size is checked before launch. (The
nodes' IAM policy: test_iam_scoping.py. No secrets in user-data, logs or objects of a whole
simulated run: test_simulated_cloud.py.)"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from aws_moto_world import AwsWorld, spec

from flow_sdk.errors import ProviderError
from flow_sdk.wire import BootConfig
from flow_sdk.providers.aws import AwsProvider
from flow_sdk.providers.aws._config import check_ssh_cidr
from flow_sdk.providers.aws._imds import SPOT_ACTION_PATH, TOKEN_HEADER, TTL_HEADER
from fake_imds import FakeImds
from flow_sdk.providers.base import LaunchRequest


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
    provider = aws.sim_provider(imds_endpoint=imds.endpoint + "/{instance_id}")
    notice = imds.interrupt("i-0b")
    assert provider.interruption_notice("i-0a") is None
    assert provider.interruption_notice("i-0b") == notice
    assert {path.split("/")[1] for _m, path, _s in imds.requests} == {"i-0a", "i-0b"}
    # a simulated cloud with no imds_endpoint has no metadata service: never a notice, and
    # never a connection attempt (this process may reach 127.0.0.0/8 only)
    bare = aws.sim_provider()
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
    assert {p.field for p in problems} == {"provider_config"}  # the node policy outgrows IAM's too
    assert "16384-byte user-data limit" in problems[0].message
    assert aws.provider().check(spec(priority="high")) == []
    boot = BootConfig("big-1", "aws", provider.config(), secret="0" * 64)
    # a launch not checked first is refused too: the prefix outgrows the task's node policy
    # (made before the user-data), and nothing is left
    with pytest.raises(ProviderError, match="shorten provider_config prefix"):
        provider.launch(LaunchRequest("big-1", spec(priority="high"), boot))
    assert aws.non_terminated() == [] and aws.client("iam").list_roles()["Roles"] == []


@pytest.mark.parametrize(("key", "value"), [("prefix", "*/"), ("prefix", "flow/*/"),
                                            ("prefix", "../up/"), ("prefix", "/abs/"),
                                            ("log_group_prefix", "/flow/*"),
                                            ("log_group_prefix", "/flow/?x")])
def test_config_values_that_become_arns_refuse_wildcards_before_launch(
        aws: AwsWorld, key: str, value: str) -> None:
    from flow_sdk import FlowApp, ValidationError

    app = FlowApp("arns", provider="aws", provider_config=aws.config(**{key: value}))
    with pytest.raises(ValidationError, match=f"provider_config.{key}"):
        app.function(priority="high")(_noop)
    assert aws.instances() == []  # nothing was launched


def _noop() -> None:
    return None
