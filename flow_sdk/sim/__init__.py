"""The simulated cloud: rehearse an aws launch on this machine, with no account.

``provider="aws-sim"`` (``_provider.AwsSimProvider``) is the ``aws`` provider against a
simulated account it brings up itself:

* ``_server``: the account's moto server, one per flow data directory (``$FLOW_HOME/aws-sim``),
  recorded in ``server.json`` (pid, port, started) and reused by every later command while it
  runs; ``_serve`` is that server's process, which stops itself after ``idle_stop_s`` with no
  request and no running instance. ``python -m flow_sdk.sim stop`` stops it at once.
* ``_gaps``: what moto lacks and flow calls (EC2 placement groups), in the server only.
* ``_inventory``: what the account still holds, listed by ``flow gc --provider aws-sim``.

The instances themselves are the aws provider's simulated node runtime (``simulate``); the
aws provider never imports this package.
"""

from flow_sdk.sim._provider import AwsSimProvider, SimSettings, sim_home, stop_account

__all__ = ["AwsSimProvider", "SimSettings", "sim_home", "stop_account"]
