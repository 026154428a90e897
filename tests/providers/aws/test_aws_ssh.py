"""SSH on AWS (issue #6): the host key is read from the node's serial console and pinned;
nothing is auto-accepted and the user-data holds no key material."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from aws_moto_world import AwsWorld, launch_ids, spec
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from moto.core.responses import ActionResult
from moto.core.utils import utcnow
from moto.ec2.responses.general import SAMPLE_CONSOLE_OUTPUT, General
from moto.ec2.utils import Base64EncodedString

from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws import _hostkeys
from flow_sdk.providers.aws._resources import key_path
from flow_sdk.providers.aws._userdata import template

CONSOLES: dict[str, str] = {}  # instance id -> the serial console text moto returns


@pytest.fixture(autouse=True)
def _console(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """moto prints one fixed console text; here each instance prints what the test sets."""

    def get_console_output(self: Any) -> ActionResult:
        instance = self.ec2_backend.get_instance(self._get_param("InstanceId"))
        text = CONSOLES.get(instance.id, SAMPLE_CONSOLE_OUTPUT)
        return ActionResult({"InstanceId": instance.id, "Timestamp": utcnow(),
                             "Output": Base64EncodedString.from_raw_string(text)})

    monkeypatch.setattr(General, "get_console_output", get_console_output)
    CONSOLES.clear()
    yield CONSOLES
    CONSOLES.clear()


def new_host_key() -> str:
    public = ed25519.Ed25519PrivateKey.generate().public_key()
    return public.public_bytes(serialization.Encoding.OpenSSH,
                               serialization.PublicFormat.OpenSSH).decode()


def console_with(*keys: str, rsa: bool = True) -> str:
    lines = [SAMPLE_CONSOLE_OUTPUT.rstrip("\n"), "[   12.3] cloud-init: running modules",
             _hostkeys.BEGIN]
    if rsa:
        lines.append("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7")
    lines += [f"{k}" for k in keys]
    lines += [_hostkeys.END, "[   13.0] flow bootstrap: installing the agent"]
    return "\r\n".join(lines) + "\r\n"


def raw_instance(world: AwsWorld, instance_id: str) -> dict[str, Any]:
    return next(i for i in world.instances() if i["InstanceId"] == instance_id)


def test_endpoint_pins_the_host_key_the_node_printed(aws: AwsWorld) -> None:
    provider = aws.provider()
    [node] = launch_ids(provider, "ssh-1", spec(num_instances=1, priority="high"))
    key = new_host_key()
    CONSOLES[node] = console_with(key)
    endpoint = provider.ssh_endpoint("ssh-1", node)
    raw = raw_instance(aws, node)
    assert endpoint.host_key == key and endpoint.host_key.startswith("ssh-ed25519 AAAA")
    assert endpoint.host == raw["PublicIpAddress"]
    assert (endpoint.port, endpoint.user) == (22, "ubuntu")
    assert endpoint.key_path == str(key_path("ssh-1", "us-east-1"))
    assert stat.S_IMODE(os.stat(endpoint.key_path).st_mode) == 0o600

    private = aws.provider(ssh_address="private", ssh_user="ec2-user")
    other = private.ssh_endpoint("ssh-1", node)
    assert (other.host, other.user, other.host_key) == (raw["PrivateIpAddress"], "ec2-user", key)
    provider.terminate("ssh-1")


def test_a_node_that_has_not_published_its_key_gives_a_clear_error(aws: AwsWorld) -> None:
    provider = aws.provider()
    [node] = launch_ids(provider, "ssh-2", spec(num_instances=1, priority="high"))
    with pytest.raises(ProviderError, match="has not published its SSH host key yet.*retry "
                                            "in a minute"):
        provider.ssh_endpoint("ssh-2", node)  # moto's stock console: no marker block
    CONSOLES[node] = console_with(new_host_key()).split(_hostkeys.END)[0]  # block cut short
    with pytest.raises(ProviderError, match="has not published"):
        provider.ssh_endpoint("ssh-2", node)
    CONSOLES[node] = console_with(new_host_key(), new_host_key())  # two keys: trust none
    with pytest.raises(ProviderError, match="refusing to pin"):
        provider.ssh_endpoint("ssh-2", node)
    with pytest.raises(ProviderError, match="no node i-nope"):
        provider.ssh_endpoint("ssh-2", "i-nope")
    provider.terminate("ssh-2")


def test_parser_ignores_malformed_and_outside_keys() -> None:
    key = new_host_key()
    text = (f"ssh-ed25519 {key.split()[1]}\n{_hostkeys.BEGIN}\nssh-ed25519 AAAAnotakey\n"
            f"{key} root@host\n{key}\n{_hostkeys.END}\n")
    assert _hostkeys.host_keys(text) == [key]  # the comment-bearing line is not a bare key
    assert _hostkeys.pinned_host_key(text, "i-1") == key


def test_user_named_key_pair_needs_ssh_key_path(aws: AwsWorld, tmp_path: Any) -> None:
    aws.client("ec2").create_key_pair(KeyName="mine", KeyType="ed25519")
    provider = aws.provider()
    [node] = launch_ids(provider, "ssh-3", spec(num_instances=1, priority="high", key_name="mine"))
    CONSOLES[node] = console_with(new_host_key())
    with pytest.raises(ProviderError, match="ssh_key_path"):
        provider.ssh_endpoint("ssh-3", node)
    mine = tmp_path / "mine.pem"
    endpoint = aws.provider(ssh_key_path=str(mine)).ssh_endpoint("ssh-3", node)
    assert endpoint.key_path == str(mine)
    provider.terminate("ssh-3")


def test_user_data_prints_the_host_keys_and_holds_no_key_material(aws: AwsWorld) -> None:
    provider = aws.provider()
    [node] = launch_ids(provider, "ssh-4", spec(num_instances=1, priority="high"))
    recorded = aws.client("ec2").describe_instance_attribute(InstanceId=node,
                                                             Attribute="userData")
    script = base64.b64decode(recorded["UserData"]["Value"]).decode()
    assert "PRIVATE KEY" not in script and "KeyMaterial" not in script
    assert key_path("ssh-4", "us-east-1").read_text() not in script
    printing = script.index(f'echo "{_hostkeys.BEGIN}"')
    assert script.index(f'echo "{_hostkeys.END}"') > printing
    assert "/etc/ssh/ssh_host_*_key.pub" in script and "/dev/console" in script
    assert printing < script.index("python -m flow_sdk.providers.aws._bootlog")
    assert printing < script.index("imds_token=")  # before anything that can hang
    provider.terminate("ssh-4")


def test_printing_step_emits_a_block_the_parser_reads(tmp_path: Any) -> None:
    """Run the template's printing function against a fake /etc/ssh (bash, no root)."""
    key = new_host_key()
    etc = tmp_path / "ssh"
    etc.mkdir()
    (etc / "ssh_host_ed25519_key.pub").write_text(f"{key} root@node\n")
    (etc / "ssh_host_ed25519_key").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nx\n")
    text = template()
    start = text.index("flow_host_keys() {")
    function = text[start:text.index("\n}\n", start) + 3].replace("/etc/ssh", str(etc))
    out = subprocess.run(["bash", "-c", function + "flow_host_keys"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    assert "PRIVATE" not in out
    assert _hostkeys.pinned_host_key(out, "i-1") == key


def test_simulated_nodes_have_no_ssh(aws: AwsWorld) -> None:
    provider = aws.sim_provider()
    with pytest.raises(ProviderError, match="runs no sshd"):
        provider.ssh_endpoint("ssh-5", "i-1")
