"""Stopping a task's nodes: its instances terminated in every region it used, what the node
runtime runs for them stopped, and its per-task resources deleted (or deferred while the
instances shut down: ``gc`` removes those later), its node role and instance profile (with
its S3 mount grants) and its secret parameter last."""

from __future__ import annotations

from collections.abc import Sequence

from botocore.exceptions import BotoCoreError, ClientError

from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws._clients import error_code, error_message
from flow_sdk.providers.aws._rollback import terminate_tagged
from flow_sdk.providers.aws._nodes import AwsNodes
from flow_sdk.providers.aws._resources import Cleanup, delete_resources, tagged_resources


def terminate_task(nodes: AwsNodes, task_id: str) -> Cleanup:
    """Terminate every node of the task and delete its resources; returns what was done."""
    result = Cleanup()
    regions = nodes.regions_for(task_id)
    try:
        for region in regions:
            ids = terminate_tagged(nodes.clients.get("ec2", region), task_id)
            result.deleted.extend(f"{region} instance {i}" for i in ids)
        try:
            result.deleted.extend(f"process {pid}" for pid in nodes.runtime.stop(task_id))
        except OSError as exc:  # the node runtime's trouble never keeps the resources
            result.deferred.append(f"what the node runtime runs for the task: {exc}; run "
                                   "`flow gc`")
        for region in regions:
            ec2 = nodes.clients.get("ec2", region)
            found = tagged_resources(ec2, task_id,
                                     placement_groups=nodes.task_efa.get(task_id, False))
            done = delete_resources(ec2, region, found)
            result.deleted.extend(done.deleted)
            result.deferred.extend(done.deferred)
        result.deleted.extend(nodes.delete_task_access(task_id))
    except (ClientError, BotoCoreError) as exc:
        code = error_code(exc) if isinstance(exc, ClientError) else type(exc).__name__
        message = error_message(exc) if isinstance(exc, ClientError) else str(exc)
        raise ProviderError(f"could not terminate task {task_id}: {code}: {message}; "
                            "retry, or run `flow gc`") from exc
    return result


def terminate_instances(nodes: AwsNodes, task_id: str, instance_ids: Sequence[str]) -> None:
    """Terminate the named nodes of the task, and nothing else (ids of other tasks, or
    already gone, are left alone); the runtime stops what it runs for them."""
    ids = list(dict.fromkeys(instance_ids))
    if not ids:
        return
    try:
        for region in nodes.regions_for(task_id):
            terminate_tagged(nodes.clients.get("ec2", region), task_id, instance_ids=ids)
    except (ClientError, BotoCoreError) as exc:
        raise ProviderError(f"could not terminate nodes {ids} of task {task_id}: {exc}"
                            ) from exc
    nodes.runtime.stop(task_id, ids)
