"""SSH to an aws node: its address, the login user, the private key, and the ed25519 host
key its bootstrap printed to the serial console (pinned)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws import _hostkeys
from flow_sdk.providers.aws._nodes import AwsNodes
from flow_sdk.providers.aws._resources import key_path, resource_name
from flow_sdk.providers.base import SshEndpoint


def ssh_endpoint(nodes: AwsNodes, task_id: str, instance_id: str) -> SshEndpoint:
    """How to reach one node over SSH, its host key pinned: the ed25519 key the node's
    bootstrap printed to its serial console (``_hostkeys``), read with GetConsoleOutput.
    The address is the public or private IP (provider_config ``ssh_address``), the user
    ``ssh_user``, the key the per-task key pair written (0600) at launch, or
    ``ssh_key_path`` for a user-named key pair. Raises ProviderError saying why when the
    node cannot be reached yet (no host key published, no address) or at all."""
    cfg = nodes.cfg
    found = [(region, raw) for region, raw in nodes.describe_in_regions(task_id)
             if raw.get("InstanceId") == instance_id]
    if not found:
        raise ProviderError(f"task {task_id} has no node {instance_id}")
    region, raw = found[0]
    state = str(raw.get("State", {}).get("Name"))
    if state != "running":
        raise ProviderError(f"node {instance_id} of task {task_id} is {state}, not running")
    field = "PublicIpAddress" if cfg.ssh_address == "public" else "PrivateIpAddress"
    host = raw.get(field)
    if not host:
        raise ProviderError(f"node {instance_id} has no {cfg.ssh_address} IP address; "
                            "set provider_config ssh_address='private' to dial its VPC "
                            "address (through a VPN or bastion)")
    key_file = _key_file(nodes, task_id, region, raw)
    try:
        console = nodes.clients.get("ec2", region).get_console_output(
            InstanceId=instance_id, Latest=True)
    except (ClientError, BotoCoreError) as exc:
        raise ProviderError(f"could not read the serial console of node {instance_id} for "
                            f"its SSH host key ({exc}); the caller needs "
                            "ec2:GetConsoleOutput") from exc
    host_key = _hostkeys.pinned_host_key(str(console.get("Output") or ""), instance_id)
    return SshEndpoint(host=str(host), port=22, user=cfg.ssh_user, host_key=host_key,
                       key_path=str(key_file))


def _key_file(nodes: AwsNodes, task_id: str, region: str, raw: Mapping[str, Any]) -> Path:
    key_name = raw.get("KeyName")
    if key_name == resource_name(task_id):
        path = key_path(task_id, region)
        if not path.exists():
            raise ProviderError(f"the private key of task {task_id} ({path}) is not on this "
                                "machine; it is written only where the task was launched")
        return path
    if nodes.cfg.ssh_key_path is None:
        raise ProviderError(f"node {raw.get('InstanceId')} uses your key pair {key_name!r}; "
                            "set provider_config ssh_key_path to its private key file")
    return Path(nodes.cfg.ssh_key_path).expanduser()
