"""``flow gc`` for AWS: reclaim instances, security groups, key pairs, placement groups and
node roles (with their instance profiles and policies) whose task has ended, and what the node
runtime runs for ended tasks.

Only resources tagged with this provider's store (``flow:store = s3://bucket/prefix``) are
considered, so two flow installations sharing an account never reclaim each other's. Which
tasks ended is ``flow_sdk.lifecycle``'s judgement (``ended``), made from what is sealed with
each task's secret: its outcome, its launch lease, its record's runtime cap. Nothing here
reads the store to decide that a task ended: a store writer without the secret could forge
any of those objects (or delete them), and a provider holds no secret. Without a judgement a
task is live, and the report names it; only a resource whose task tag is empty is reclaimed
on the provider's own view.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from flow_sdk.errors import ProviderError
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
from flow_sdk.providers.gcreport import GcReport

EMPTY_TASK_ID = "carries an empty task id"


def _live_instances(ec2: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for page in ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag-key", "Values": [TAG_TASK]},
                     {"Name": "instance-state-name",
                      "Values": ["pending", "running", "stopping", "stopped"]}],
            PaginationConfig={"PageSize": 1000}):
        found.extend(i for r in page["Reservations"] for i in r["Instances"])
    return found


def collect(nodes: AwsNodes, *, dry_run: bool = False,
            ended: Mapping[str, str] | None = None) -> GcReport:
    """Reclaim, in every launch region of the provider, what the tasks ``ended`` names
    (judged ended by ``flow_sdk.lifecycle``, with why) left, and what carries no task id, and
    stop what the node runtime still runs for them."""
    report = GcReport("aws", dry_run=dry_run)
    mine = nodes.store_tag
    judge = _Judge(report, ended or {})
    try:
        instances = {region: _live_instances(nodes.clients.get("ec2", region))
                     for region in nodes.cfg.launch_regions}

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
    """Each task's verdict: why its leftovers may go (``ended``, or an empty task id), or None
    while it may be live; the report gets the reason of every ended task and the id of every
    live one."""

    def __init__(self, report: GcReport, ended: Mapping[str, str]) -> None:
        self.report = report
        self.verdicts: dict[str, str] = {"": EMPTY_TASK_ID, **ended}

    def verdict(self, task_id: str) -> str | None:
        """Why the task's leftovers may go, or None while it may be live."""
        return self.verdicts.get(task_id)

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
