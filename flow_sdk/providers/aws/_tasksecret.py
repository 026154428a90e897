"""A task's secret on AWS: an SSM SecureString parameter, never user-data.

Anyone allowed ``ec2:DescribeInstanceAttribute`` in the account can read an instance's
user-data, so the secret that signs a task's records (``flow_sdk.wire.signing``) does not
travel in it. The client stores it, before any node launches, as the SecureString parameter
``/flow-sdk/<store digest>/<task id>`` (the IAM path of the task's role, ``_iam.role_path``)
in the store's region, encrypted with the account's ``aws/ssm`` key. The task's node policy
allows ``ssm:GetParameter`` on that one parameter; the bootstrap reads it into a 0600 file
that the agent removes once read (``flow_sdk.wire.take_node_boot``). The parameter is deleted
with the task's role: by teardown, by a failed launch's rollback, and by ``flow gc`` for tasks
that ended. A pool's secret is kept the same way under the pool's id; its tasks' secrets
reach its nodes sealed under the pool's.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws._clients import error_code, error_message, tolerating
from flow_sdk.providers.aws._iam import role_path, secret_parameter


def put_task_secret(ssm: Any, store_tag: str, task_id: str, secret: str) -> str:
    """Store the task's secret (a retried launch of the same task overwrites its own);
    returns the parameter's name."""
    name = secret_parameter(store_tag, task_id)
    if not secret:
        raise ProviderError(f"the launch of task {task_id} carries no task secret; launch "
                            "tasks through FlowApp, which makes one per task")
    try:
        ssm.put_parameter(Name=name, Value=secret, Type="SecureString", Overwrite=True,
                          Description=f"flow-sdk: the secret of task {task_id}"[:1024])
    except ClientError as exc:
        raise ProviderError(
            f"could not store the secret of task {task_id} as the SSM parameter {name}: "
            f"{error_code(exc)}: {error_message(exc)}; grant ssm:PutParameter and "
            "ssm:DeleteParameter on parameter/flow-sdk/* (docs/aws-caller-policy.json)"
        ) from exc
    return name


def delete_task_secret(ssm: Any, store_tag: str, task_id: str) -> list[str]:
    """Delete the task's secret parameter; returns what was deleted (nothing when it was
    already gone)."""
    name = secret_parameter(store_tag, task_id)
    try:
        with tolerating("ParameterNotFound"):
            ssm.delete_parameter(Name=name)
            return [f"SSM parameter {name}"]
    except ClientError as exc:
        raise ProviderError(f"could not delete the SSM parameter {name} of task {task_id}: "
                            f"{error_code(exc)}: {error_message(exc)}; run `flow gc` again"
                            ) from exc
    return []


def task_secret_ids(ssm: Any, store_tag: str) -> dict[str, str]:
    """The store's task secrets still in SSM: parameter name -> task id."""
    path = role_path(store_tag)
    found: dict[str, str] = {}
    pages = ssm.get_paginator("describe_parameters").paginate(
        ParameterFilters=[{"Key": "Path", "Option": "OneLevel", "Values": [path.rstrip("/")]}])
    for page in pages:
        for parameter in page["Parameters"]:
            name = str(parameter["Name"])
            if name.startswith(path) and "/" not in name[len(path):]:
                found[name] = name[len(path):]
    return found
