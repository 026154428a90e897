"""``flow gc`` for AWS: reclaim instances, security groups, key pairs, placement groups and
node roles (with their instance profiles and policies) whose task has ended, or that carry no
live task; and what the node runtime runs for ended tasks.

Only resources tagged with this provider's store (``flow:store = s3://bucket/prefix``) are
considered, so two flow installations sharing an account never reclaim each other's. A task is
live while its record is in the store (a pool's: its pool record), its launch was not rolled
back or cut short (a launch lease that its client stopped renewing: ``_lease``), it has an
instance up or its launch has not ended, and it is within its runtime cap. The outcome is not
read here: a store writer without the task's secret could forge one, so
``flow_sdk.lifecycle`` checks it and names the tasks that ended (``ended``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from flow_sdk import wire
from flow_sdk.errors import ProviderError, RecordError
from flow_sdk.wire import LaunchLease, TaskRecord
from flow_sdk.wire.pools import pool_key
from flow_sdk.providers.aws._iam import task_roles
from flow_sdk.providers.aws._nodes import AwsNodes
from flow_sdk.providers.aws._tasksecret import delete_task_secret, task_secret_ids
from flow_sdk.providers.aws._resources import (
    TAG_STORE,
    TAG_TASK,
    delete_resources,
    tag_value,
    tagged_resources,
)
from flow_sdk.providers.base import GcReport, ObjectStore

RUNTIME_GRACE_S = 3600.0  # past max_run_time_hours by this much, a task counts as ended


def task_verdict(store: ObjectStore, task_id: str, now: float, up: bool) -> str | None:
    """None while the task is live, else why its resources may go; ``up``: whether an
    instance of the task is pending, running, stopping or stopped."""
    if not task_id:
        return "carries an empty task id"
    raw = store.get(wire.task_key(task_id))
    lease = store.get(wire.launch_lease_key(task_id))
    if raw is None and store.exists(pool_key(task_id)):  # a pool: live until the caller's
        return _launch_verdict(lease, now)  # gc says
    if raw is None:
        return "no task record in the store"
    launch = _launch_verdict(lease, now)
    if launch is not None:
        return launch
    if not up and _launched(lease):
        return "its gang launched and no instance of it is up any more"
    record = TaskRecord.from_json(raw)
    cap = record.spec.get("max_run_time_hours")
    if cap is not None and now > record.created_at + float(cap) * 3600 + RUNTIME_GRACE_S:
        return "task is past its max_run_time_hours and wrote no outcome"
    return None


def _launch_verdict(raw: bytes | None, now: float) -> str | None:
    """Why the task's launch lease says its resources may go, or None."""
    if raw is None:
        return None  # a task launched before launch leases, or by another provider
    try:
        lease = LaunchLease.from_json(raw)
    except RecordError:
        return None  # malformed: the other rules decide
    if lease.state == "rolled-back":
        return "its launch ended without a gang and was rolled back"
    if lease.state == "launching" and lease.stale(now):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lease.renewed_at))
        return (f"its launch was cut short: the launching client ({lease.holder}) last "
                f"renewed its launch lease at {when}")
    return None


def _launched(raw: bytes | None) -> bool:
    """Whether the task's launch lease says its gang started."""
    try:
        return raw is not None and LaunchLease.from_json(raw).state == "launched"
    except RecordError:
        return False


def _live_instances(ec2: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for page in ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag-key", "Values": [TAG_TASK]},
                     {"Name": "instance-state-name",
                      "Values": ["pending", "running", "stopping", "stopped"]}],
            PaginationConfig={"PageSize": 1000}):
        found.extend(i for r in page["Reservations"] for i in r["Instances"])
    return found


def collect(nodes: AwsNodes, *, dry_run: bool = False, now: float | None = None,
            ended: Mapping[str, str] | None = None) -> GcReport:
    """Reclaim, in every launch region of the provider, what no live task of its store owns
    (or what ``ended`` names: tasks judged ended by ``flow_sdk.lifecycle``, with why), and
    stop what the node runtime still runs for ended tasks."""
    report = GcReport("aws", dry_run=dry_run)
    mine = nodes.store_tag
    try:
        instances = {region: _live_instances(nodes.clients.get("ec2", region))
                     for region in nodes.cfg.launch_regions}
        up = {tag_value(i, TAG_TASK) or "" for found in instances.values() for i in found}
        judge = _Judge(nodes, report, time.time() if now is None else now, ended or {}, up)

        def reclaim(resource: dict[str, Any]) -> bool:
            if tag_value(resource, TAG_STORE) != mine:
                return False  # another flow installation's (or not flow's): never touched
            return judge.ended(tag_value(resource, TAG_TASK) or "")

        for region, live in instances.items():
            ec2 = nodes.clients.get("ec2", region)
            doomed = [i["InstanceId"] for i in live if reclaim(i)]
            report.terminated_instances.extend(f"{region} instance {i}" for i in doomed)
            found = tagged_resources(ec2, None, placement_groups=True)
            found = {kind: [r for r in items if reclaim(r)] for kind, items in found.items()}
            _reclaim_in_region(ec2, region, doomed, found, report)
        if nodes.cfg.instance_profile is None:  # a user-named profile: not flow's to delete
            _reclaim_roles(nodes, report, judge, dry_run)
        _reclaim_secrets(nodes, report, judge, dry_run)
    except (ClientError, BotoCoreError) as exc:
        raise ProviderError(f"flow gc stopped: {exc}; what it reclaimed so far: "
                            f"{report.terminated_instances + report.deleted}") from exc
    for task_id in nodes.runtime.tasks():  # what the runtime still runs for ended tasks
        if judge.verdict(task_id) is not None and not dry_run:
            report.stopped_processes.extend(nodes.runtime.stop(task_id))
    report.live_tasks.sort()
    return report


def _reclaim_in_region(ec2: Any, region: str, doomed: list[str],
                       found: dict[str, list[dict[str, Any]]], report: GcReport) -> None:
    """Terminate ``doomed`` instances and delete ``found`` resources (a dry run only names
    the resources)."""
    if report.dry_run:
        report.deleted.extend(
            f"{region} security group {g['GroupId']}" for g in found["security_groups"])
        report.deleted.extend(f"{region} key pair {k['KeyName']}" for k in found["key_pairs"])
        report.deleted.extend(f"{region} placement group {g['GroupName']}"
                              for g in found["placement_groups"])
        return
    for start in range(0, len(doomed), 1000):
        ec2.terminate_instances(InstanceIds=doomed[start:start + 1000])
    done = delete_resources(ec2, region, found)
    report.deleted.extend(done.deleted)
    report.deferred.extend(done.deferred)


class _Judge:
    """Each task's verdict (``task_verdict``), asked of the store once per task; the report
    gets the reason of every ended task and the id of every live one."""

    def __init__(self, nodes: AwsNodes, report: GcReport, now: float,
                 ended: Mapping[str, str], up: set[str]) -> None:
        self.nodes, self.report, self.now, self.up = nodes, report, now, up
        self.verdicts: dict[str, str | None] = dict(ended)

    def verdict(self, task_id: str) -> str | None:
        """Why the task's leftovers may go, or None while it lives."""
        if task_id not in self.verdicts:
            self.verdicts[task_id] = task_verdict(self.nodes.store, task_id, self.now,
                                                  task_id in self.up)
        return self.verdicts[task_id]

    def ended(self, task_id: str) -> bool:
        """Whether what the task left may go; the report says why, or that it lives."""
        verdict = self.verdict(task_id)
        if verdict is None:
            if task_id not in self.report.live_tasks:
                self.report.live_tasks.append(task_id)
            return False
        self.report.reasons[task_id] = verdict
        return True


def _reclaim_roles(nodes: AwsNodes, report: GcReport, judge: _Judge, dry_run: bool) -> None:
    """Delete the node roles of this store's tasks that ended (their S3 mount grants go with
    them)."""
    for name, task_id in sorted(task_roles(nodes.iam, nodes.store_tag).items()):
        if not judge.ended(task_id):
            continue
        if dry_run:
            report.deleted.append(f"IAM role {name} (task {task_id})")
        else:
            report.deleted.extend(nodes.delete_task_access(task_id))


def _reclaim_secrets(nodes: AwsNodes, report: GcReport, judge: _Judge, dry_run: bool) -> None:
    """Delete the secret parameters of this store's tasks that ended (``_tasksecret``)."""
    ssm = nodes.clients.get("ssm", nodes.cfg.region)
    for name, task_id in sorted(task_secret_ids(ssm, nodes.store_tag).items()):
        if not judge.ended(task_id):
            continue
        if dry_run:
            report.deleted.append(f"SSM parameter {name} (task {task_id})")
        else:
            report.deleted.extend(delete_task_secret(ssm, nodes.store_tag, task_id))
