"""The boot configuration is one typed object from the client to the agent: encoded once,
decoded once, carried as it is."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from flow_sdk.errors import RecordError
from flow_sdk.wire import BootConfig, envvars, node_boot, take_node_boot

BOOT = BootConfig("t-1", "aws", {"region": "us-east-1", "launch": {"attempt": 2}},
                  secret="0123456789abcdef" * 4)


def test_decode_reads_what_encode_wrote() -> None:
    text = BOOT.encode()
    assert "\n" not in text
    assert BootConfig.decode(text) == BOOT


def test_a_provider_sets_its_nodes_config_on_the_typed_object() -> None:
    node = BOOT.with_provider_config({"region": "eu-west-1"})
    assert node == BootConfig("t-1", "aws", {"region": "eu-west-1"}, secret=BOOT.secret)
    assert BootConfig.decode(node.encode()).provider_config == {"region": "eu-west-1"}


@pytest.mark.parametrize(("text", "problem"), [
    ("not json", "not JSON"),
    ("[1]", "expected the fields"),
    ('{"task_id": "t", "provider": "aws", "provider_config": {}}', "expected the fields"),
    ('{"task_id": "t", "provider": "aws", "provider_config": {}, "secret": "", "x": 1}',
     "expected the fields"),
    ('{"task_id": 1, "provider": "aws", "provider_config": {}, "secret": "", "role": "task"}',
     "must be strings"),
    ('{"task_id": "t", "provider": "aws", "provider_config": [], "secret": "", "role": "task"}',
     "provider_config an object"),
    ('{"task_id": "t", "provider": "aws", "provider_config": {}, "secret": "", "role": "boss"}',
     "role one of"),
])
def test_decode_refuses_anything_else_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(RecordError, match=problem):
        BootConfig.decode(text)


def test_a_pool_boot_round_trips_and_starts_the_pool_daemon() -> None:
    pool = BootConfig("dev-1", "local", {}, secret=BOOT.secret, role="pool")
    assert BootConfig.decode(pool.encode()) == pool
    assert (pool.node_module, BOOT.node_module) == ("flow_sdk.node.pool", "flow_sdk.node.agent")


def test_a_node_reads_its_boot_from_the_file_before_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "boot.json"
    path.write_text(BOOT.encode(), encoding="utf-8")
    other = BootConfig("t-2", "local", {}).encode()
    environ = {envvars.BOOT_FILE: str(path), envvars.BOOT: other,
               envvars.INSTANCE_ID: "i-1", envvars.NODE_ADDRESS: "10.0.0.1"}
    assert node_boot(environ) == (BOOT, "i-1", "10.0.0.1")
    del environ[envvars.BOOT_FILE]
    assert node_boot(environ)[0] == BootConfig.decode(other)


def test_the_agent_takes_the_secret_from_its_file_and_leaves_no_trace(tmp_path: Path) -> None:
    """EC2: ``FLOW_BOOT`` (user-data) has no secret; the agent reads it from the 0600 file
    the bootstrap fetched, then both the file and the variables are gone."""
    secret_file = tmp_path / ".task-secret"
    secret_file.write_text(BOOT.secret + "\n", encoding="ascii")
    environ = {envvars.BOOT: replace(BOOT, secret="").encode(),
               envvars.SECRET_FILE: str(secret_file),
               envvars.INSTANCE_ID: "i-1", envvars.NODE_ADDRESS: "10.0.0.1"}
    assert node_boot(environ)[0].secret == ""  # what the boot-log shipper reads
    assert take_node_boot(environ) == (BOOT, "i-1", "10.0.0.1")
    assert not secret_file.exists()
    assert sorted(environ) == sorted([envvars.INSTANCE_ID, envvars.NODE_ADDRESS])
    environ[envvars.BOOT] = replace(BOOT, secret="").encode()
    with pytest.raises(RecordError, match="carries no secret"):  # the file is gone
        take_node_boot(environ)
    secret_file.write_bytes(b"\xe9" * 64)
    environ.update({envvars.BOOT: BOOT.encode(), envvars.SECRET_FILE: str(secret_file)})
    with pytest.raises(RecordError, match="not hex text"):
        take_node_boot(environ)


def test_a_node_without_a_boot_is_told_where_it_comes_from() -> None:
    with pytest.raises(RecordError, match="FLOW_BOOT nor FLOW_BOOT_FILE"):
        node_boot({envvars.INSTANCE_ID: "i-1", envvars.NODE_ADDRESS: "10.0.0.1"})


def test_the_local_provider_hands_the_boot_over_in_a_0600_file(tmp_path: Path) -> None:
    from flow_sdk.providers.base import LaunchRequest
    from flow_sdk.providers.launch import node_launch
    from flow_sdk.providers.local import _node
    from flow_sdk.spec import build_task_spec

    request = LaunchRequest("t-1", build_task_spec(app="a", name="f", num_instances=1), BOOT)
    env = _node.node_env(node_launch(request), "local-1", "127.0.0.1", tmp_path, "", 1)
    path = Path(env[envvars.BOOT_FILE])
    assert path.parent == tmp_path and os.stat(path).st_mode & 0o777 == 0o600
    assert not any(BOOT.secret in value for value in env.values())  # only in the file
    assert node_boot(env) == (BOOT, "local-1", "127.0.0.1")
