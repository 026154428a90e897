"""Rolling a launch back: terminate what a launch (or one of its attempts) started, found by
the ids EC2 returned, by the ClientTokens of the requests sent (an answer may have been lost),
and by the task's tags. ``LaunchLedger`` keeps every token and id of a launch.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from flow_sdk.providers.aws._clients import error_code
from flow_sdk.providers.aws._resources import TAG_ATTEMPT, TAG_REPLACEMENT, TAG_TASK

ID_RETRIES = 4  # an instance id EC2 just returned, not yet known to TerminateInstances

ALIVE_STATES = ["pending", "running", "stopping", "stopped"]


def terminate_tagged(ec2: Any, task_id: str, attempt: int | None = None,
                     replacement: str | None = None, instance_ids: list[str] | None = None
                     ) -> list[str]:
    """Terminate every non-terminated instance of the task; of one attempt, of one replacement
    try, or among ``instance_ids`` only, when given. Returns the ids it terminated."""
    filters = [{"Name": f"tag:{TAG_TASK}", "Values": [task_id]},
               {"Name": "instance-state-name", "Values": ALIVE_STATES}]
    if attempt is not None:
        filters.append({"Name": f"tag:{TAG_ATTEMPT}", "Values": [str(attempt)]})
    if replacement is not None:
        filters.append({"Name": f"tag:{TAG_REPLACEMENT}", "Values": [replacement]})
    if instance_ids is not None:
        if not instance_ids:
            return []
        filters.append({"Name": "instance-id", "Values": list(instance_ids)})
    ids: list[str] = []
    for page in ec2.get_paginator("describe_instances").paginate(
            Filters=filters, PaginationConfig={"PageSize": 1000}):
        ids.extend(i["InstanceId"] for r in page["Reservations"] for i in r["Instances"])
    for start in range(0, len(ids), 1000):
        ec2.terminate_instances(InstanceIds=ids[start:start + 1000])
    return ids


def alive_by_token(ec2: Any, tokens: list[str]) -> list[str]:
    """Non-terminated instances that requests with these ClientTokens started (an attempt
    whose answer was lost is found this way: its instance ids never reached the caller)."""
    ids: list[str] = []
    for start in range(0, len(tokens), 200):  # at most 200 values per filter
        for page in ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": "client-token", "Values": tokens[start:start + 200]},
                         {"Name": "instance-state-name", "Values": ALIVE_STATES}],
                PaginationConfig={"PageSize": 1000}):
            ids.extend(i["InstanceId"] for r in page["Reservations"] for i in r["Instances"])
    return ids


@dataclass
class LaunchLedger:
    """What one launch asked EC2 for and what EC2 answered, per region: the ClientToken of
    every request sent, and the instance ids of every answer. A rollback works from these as
    well as from the task tag: EC2 may not list a gang it just started by tag yet, and the
    ids of a request whose answer was lost are known only by its token."""

    tokens: dict[str, list[str]] = field(default_factory=dict)
    instance_ids: dict[str, list[str]] = field(default_factory=dict)

    def sent(self, region: str, token: str) -> None:
        known = self.tokens.setdefault(region, [])
        if token not in known:
            known.append(token)

    def returned(self, region: str, instance_ids: Iterable[str]) -> None:
        self.instance_ids.setdefault(region, []).extend(instance_ids)

    def roll_back(self, ec2: Any, region: str, task_id: str, retry_base_s: float = 1.0
                  ) -> list[str]:
        """Terminate, in ``region``, every instance this launch started: the ids EC2
        returned, what its tokens started, and what carries the task tag. Returns the ids."""
        ids = list(dict.fromkeys(self.instance_ids.get(region, [])
                                 + alive_by_token(ec2, self.tokens.get(region, []))))
        terminate_ids(ec2, ids, retry_base_s)
        return ids + [i for i in terminate_tagged(ec2, task_id) if i not in ids]


def terminate_ids(ec2: Any, ids: list[str], retry_base_s: float = 1.0) -> None:
    """Terminate ``ids`` (ids EC2 returned a moment ago included: an id it does not know
    yet is asked about again after ``retry_base_s``, doubling, as EC2's reads are eventually
    consistent)."""
    for start in range(0, len(ids), 1000):
        chunk = ids[start:start + 1000]
        for retry in range(ID_RETRIES + 1):
            try:
                ec2.terminate_instances(InstanceIds=chunk)
                break
            except ClientError as exc:
                if error_code(exc) != "InvalidInstanceID.NotFound" or retry == ID_RETRIES:
                    raise
                time.sleep(retry_base_s * 2 ** retry)
