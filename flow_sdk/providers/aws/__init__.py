"""The ``aws`` provider: EC2 nodes, S3 objects, CloudWatch Logs, EFS/EBS volumes.

* ``_provider``: ``AwsProvider``: checks and plans; every other job is a module of its own
  that takes the shared ``_nodes.AwsNodes`` (settings, clients, node runtime, volumes, how a
  task's instances are found).
* ``_launch``: the one gang ``run_instances`` per attempt (MinCount/MaxCount, tags, IMDSv2
  with hop limit 1, 2 for a task in its container image, instance profile, key pair, security
  group, cluster placement group + EFA interfaces, spot, ClientToken, shutdown = terminate,
  rollback of partial gangs by returned ids, token and tags) and ``failover``, the one loop
  over candidates that both the gang launch and the replacement launch run. ``_rollback``:
  terminating what a launch or one attempt started (by returned ids, ClientTokens, tags).
* ``_gang``: a task's launch: the catalog's offers (``flow_sdk.catalog.plan_offers``) in the
  zones that offer them, volumes provisioned per attempt, failed tries' regions cleaned up;
  a launch that ends early (error, Ctrl-C, SIGTERM/SIGHUP: ``_interrupts``) rolls back all it
  started. ``_lease``: the launch lease by which ``gc`` finds a client killed mid-launch.
* ``_replace``: ``add_instances`` under ``max_restarts``, called by the deciding node agent
  (a copy of a running node with the gang's tags and user-data).
* ``_volumes`` (+ ``_efs``, ``_ebs``): ``AwsProvider.volumes``: file volumes get an EFS file
  system and a mount target in the attempt's subnet, block volumes an EBS volume in the
  attempt's zone, attached once the node exists; S3 mounts get read-only grants in the node
  policy. ``gc`` never deletes volumes.
* ``_ssh``: ``ssh_endpoint`` pins the ed25519 host key the node printed to its serial console
  (``_hostkeys``) and uses the per-task key written (0600) at launch.
* ``_teardown`` / ``_gc``: terminate a task; reclaim what belongs to ended tasks (and to
  launches that were rolled back or cut short).
* ``_runtime``: the node runtime seam (``NodeRuntime``: start, stop and address the nodes,
  given each gang's typed ``NodeBoot``) and real EC2's (``Ec2Runtime``, the default); a
  provider that subclasses ``AwsProvider`` hands it another, and the provider never asks
  which it holds.
* ``_resources``: per-task security group / key pair / placement group, VPC, AMI (the Deep
  Learning Base AMI through its public SSM parameter), instance profile and its policy.
* ``_userdata`` + ``bootstrap.sh.tmpl``: the node bootstrap (no credentials and no key material
  in it; the ``max_run_time_hours`` shutdown timer is the first thing it arms, then it prints
  the SSH host keys, then mounts the task's volumes before the agent starts).
* ``_imds``: IMDSv2 reads for ``AwsProvider.interruption_notice`` (spot interruptions).
* ``_s3store`` / ``_cwlogs``: the object store and the log store.

Usage: ``FlowApp("x", provider="aws", provider_config={"region": "us-east-1"})``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flow_sdk import _lazy

if TYPE_CHECKING:  # at run time each name is imported on first use (``_lazy``): a process
    # that needs one module of this package (its boto3 clients, say) does not import the
    # whole provider
    from flow_sdk.providers.aws._config import AwsConfig
    from flow_sdk.providers.aws._provider import AwsProvider
    from flow_sdk.providers.aws._runtime import Ec2Runtime, NodeBoot, NodeRuntime

_WHERE: dict[str, str] = {
    "AwsConfig": "flow_sdk.providers.aws._config",
    "AwsProvider": "flow_sdk.providers.aws._provider",
    "Ec2Runtime": "flow_sdk.providers.aws._runtime",
    "NodeBoot": "flow_sdk.providers.aws._runtime",
    "NodeRuntime": "flow_sdk.providers.aws._runtime",
}

__getattr__, __dir__ = _lazy.exports(__name__, globals(), _WHERE)

__all__ = ["AwsConfig", "AwsProvider", "Ec2Runtime", "NodeBoot", "NodeRuntime"]
