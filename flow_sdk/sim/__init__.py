"""The simulated cloud: rehearse an aws launch on this machine, with no account.

``provider="aws-sim"`` (``_provider.AwsSimProvider``) is the ``aws`` provider against a
simulated account it brings up itself:

* ``_server``: the account's moto server, one per flow data directory (``$FLOW_HOME/aws-sim``),
  recorded in ``server.json`` (pid, port, started) and reused by every later command while it
  runs; ``_serve`` is that server's process, which stops itself after ``idle_stop_s`` with no
  request and no running instance. ``python -m flow_sdk.sim stop`` stops it at once.
* ``_access``: who may use the account: moto's IAM access control on in the server, the
  account's IAM user and its keys (``keys.json``, 0600, beside ``server.json``), moto's admin
  endpoints refused; ``_arns``: the resource ARNs moto's checks need for the calls nodes make.
* ``_gaps``: what moto lacks and flow calls (EC2 placement groups, the instance profile of
  every instance of a launch), in the server only.
* ``_inventory``: what the account still holds, listed by ``flow gc --provider aws-sim``.

* ``_instancespec``: what one instance is (``InstanceSpec``), standard library only.
* ``_nodes``: the node runtime handed to the aws provider (``SimulatedNodes``): each
  instance a process here (``_instance``) with an IMDSv2 emulator (``_imds``) that answers
  the instance's processes only and hands them their role's credentials (``_rolecreds``),
  its user-data
  run as root in a mount namespace of its own (``_root``), and shims (``shims/``) for what
  cannot exist here; it owns and stops those processes, their mounts and loop devices.
* ``_settings``: the aws-sim provider_config and the node settings.

The aws provider never imports this package (an import-linter contract).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flow_sdk import _lazy

if TYPE_CHECKING:  # at run time each name is imported on first use (``_lazy``): the
    # instance's root helper and the account's server start without the aws provider
    from flow_sdk.sim._instance import instance_pids
    from flow_sdk.sim._nodes import SimulatedNodes, simulated_address
    from flow_sdk.sim._provider import AwsSimProvider, sim_home, stop_account
    from flow_sdk.sim._settings import NodeSettings, SimSettings

_WHERE: dict[str, str] = {
    "instance_pids": "flow_sdk.sim._instance",
    "SimulatedNodes": "flow_sdk.sim._nodes",
    "simulated_address": "flow_sdk.sim._nodes",
    "AwsSimProvider": "flow_sdk.sim._provider",
    "sim_home": "flow_sdk.sim._provider",
    "stop_account": "flow_sdk.sim._provider",
    "NodeSettings": "flow_sdk.sim._settings",
    "SimSettings": "flow_sdk.sim._settings",
}

__getattr__, __dir__ = _lazy.exports(__name__, globals(), _WHERE)

__all__ = ["AwsSimProvider", "NodeSettings", "SimSettings", "SimulatedNodes",
           "instance_pids", "sim_home", "simulated_address", "stop_account"]
