"""On the simulated cloud, a task's secret is in no user-data and reaches only the agent: the
nodes read it from an SSM SecureString that only the task's role may read, through a 0600
file the agent removes, and the parameter goes with the task."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from aws_moto_world import AwsWorld
from flow_testing import process_traces, wait_until

from flow_sdk import FlowApp, TaskStatus, tasksecrets
from flow_sdk.providers.aws._iam import role_path
from flow_sdk.sim import INSTANCE_ENV, AwsSimProvider

pytestmark = pytest.mark.slow


def _holds_still() -> str:
    import time

    print("ready", flush=True)
    time.sleep(8)
    return "done"


def _node_pids(task_id: str) -> list[int]:
    """Every process of the task's simulated instances (tagged ``<task id>/...``)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if any(item.startswith(f"{INSTANCE_ENV}={task_id}/".encode()) for item in environ):
            found.append(int(proc.name))
    return found


def _is_agent(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return b"flow_sdk.node.agent" in argv


def test_the_secret_is_in_no_user_data_and_no_process_but_the_agent(aws: AwsWorld) -> None:
    app = FlowApp("secret", provider="aws-sim", provider_config=aws.sim_config())
    task = app.function(num_instances=2, priority="high", quiet=True)(_holds_still).spawn()
    provider = task.provider
    assert isinstance(provider, AwsSimProvider)
    try:
        wait_until(lambda: sum("ready" in ln for ln in task.logs()) == 2, 240, "2 ranks ready")
        secret = tasksecrets.load_task_secret(task.task_id).hex()
        ec2, ssm = aws.client("ec2"), aws.client("ssm")
        for instance in provider.list_instances(task.task_id):
            answer = ec2.describe_instance_attribute(InstanceId=instance.instance_id,
                                                     Attribute="userData")
            user_data = base64.b64decode(answer["UserData"]["Value"]).decode()
            assert "FLOW_SECRET_PARAMETER=" in user_data and secret not in user_data
        name = role_path(provider.store_tag) + task.task_id
        stored = ssm.get_parameter(Name=name, WithDecryption=True)["Parameter"]
        assert stored["Type"] == "SecureString" and stored["Value"] == secret
        pids = _node_pids(task.task_id)
        agents = [pid for pid in pids if _is_agent(pid)]
        others = [pid for pid in pids if pid not in agents]
        assert len(agents) == 2 and len(others) >= 6, (agents, others)  # bash, tee, workers
        for pid in others:
            assert secret not in process_traces(pid), pid
        assert list(aws.sim_root.rglob(".task-secret")) == []  # the agents removed it
        assert task.result(timeout=120) == "done"
    finally:
        if not task.status.is_terminal:
            task.cancel()
    assert task.status is TaskStatus.SUCCEEDED
    with pytest.raises(ssm.exceptions.ParameterNotFound):  # gone with the task
        ssm.get_parameter(Name=name)
