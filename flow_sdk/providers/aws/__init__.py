"""The ``aws`` provider: EC2 nodes, S3 objects, CloudWatch Logs.

* ``_launch``: the one gang ``run_instances`` per attempt (MinCount/MaxCount, tags, IMDSv2,
  instance profile, key pair, security group, cluster placement group + EFA interfaces, spot,
  ClientToken, shutdown = terminate) and failover across zones, regions and instance types in
  the catalog's order (``flow_sdk.catalog.plan_offers``), rolling back partial gangs.
* ``_resources``: per-task security group / key pair / placement group, VPC, AMI (the Deep
  Learning Base AMI through its public SSM parameter), instance profile and its policy.
* ``_provider``: ``AwsProvider``. Its ``add_instances`` / ``terminate_instances`` replace
  lost nodes under ``max_restarts``, called by the deciding node agent (a copy of a running
  node with the gang's tags and user-data; only the named nodes are terminated).
  Volumes: before each attempt the task's file volumes get an EFS file system and a mount
  target in the attempt's subnet (``flow_sdk.volumes.efs``), block volumes an EBS volume in the
  attempt's zone, attached once the node exists (``flow_sdk.volumes.ebs``); S3 mounts get
  read-only grants in the node policy. ``gc`` never deletes volumes.
  SSH: ``ssh_endpoint`` pins the ed25519 host key the node printed to its serial console
  (``_hostkeys``) and uses the per-task key written (0600) at launch.
* ``_userdata`` + ``bootstrap.sh.tmpl``: the node bootstrap (no credentials and no key material
  in it; the ``max_run_time_hours`` shutdown timer is the first thing it arms, then it prints
  the SSH host keys, then mounts the task's volumes before the agent starts).
* ``_imds``: IMDSv2 reads for ``AwsProvider.interruption_notice`` (spot interruptions).
* ``_s3store`` / ``_cwlogs``: the object store and the log store.
* ``_gc``: reclaim what belongs to ended tasks.
* ``_simulate``: the simulated cloud (moto's instances played by local agent processes) and
  ``FakeImds``, a metadata service on 127.0.0.1 for it.

Usage: ``FlowApp("x", provider="aws", provider_config={"region": "us-east-1"})``.
"""

from flow_sdk.providers.aws._config import AwsConfig
from flow_sdk.providers.aws._gc import GcReport
from flow_sdk.providers.aws._provider import AwsProvider, InstanceDetail
from flow_sdk.providers.aws._simulate import simulated_address

__all__ = ["AwsConfig", "AwsProvider", "GcReport", "InstanceDetail", "simulated_address"]
