"""The simulated cloud: a whole ``.remote()`` through ``provider="aws-sim"`` over real boto3/HTTP.

moto's instances boot here through the real bootstrap: launch (run_instances), discovery
(describe_instances), payload from S3, rendezvous, a real gloo all-reduce, results to S3, logs
to CloudWatch, teardown. The same function on ``provider="local"`` must give the same result.
The nodes learn their gang from the launcher's membership record: no DescribeInstances reaches
EC2 from a node for discovery. Node replacement under ``max_restarts``: a node's agent killed
with SIGKILL is replaced by a node launched from the deciding node's own process, a spot
interruption notice to the leader replaces it too, and the job completes. A task's secret is
in no user-data and reaches only the agent: the nodes read it from an SSM SecureString that
only the task's role may read, through a 0600 file the agent removes, and the parameter goes
with the task.
"""

from __future__ import annotations

import base64
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import botocore.client
import pytest
from aws_moto_world import BUCKET, AwsWorld, Wire, agent_pid, live_pids
from flow_testing import process_traces, results_or_cancel, wait_until
from moto.ec2.responses.instances import InstanceResponse

from flow_sdk import FlowApp, Task, TaskFailedError, TaskStatus, wire
from flow_sdk.home import tasksecrets
from flow_sdk.providers.aws._iam import role_path
from flow_sdk.wire import LaunchRecord
from flow_sdk.sim import AwsSimProvider, SimulatedNodes
from flow_sdk.wire import envvars
from fake_imds import FakeImds

pytestmark = pytest.mark.slow

# Each poll of a wait here asks the moto server (which runs in this process) or reads /proc:
# at wait_until's default 20 per second, the polling alone costs seconds of CPU a test.
POLL_S = 0.5


def _allreduce() -> dict[str, Any]:
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    out = {"sum": float(value.item()), "rank": dist.get_rank(),
           "world": dist.get_world_size(), "node": int(os.environ["FLOW_NODE_RANK"]),
           "local_rank": int(os.environ["LOCAL_RANK"]),
           "master": os.environ["MASTER_ADDR"]}
    dist.destroy_process_group()
    print(f"rank {out['rank']} reduced {out['sum']}", flush=True)
    return out


def _shape(results: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What must agree across providers (the leader's address naturally differs)."""
    return [(r["sum"], r["rank"], r["world"], r["node"], r["local_rank"]) for r in results]


def _counting(counts: dict[str, int], key: str, original: Callable[..., Any],
              wanted: Callable[..., bool]) -> Callable[..., Any]:
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        if wanted(*args):
            counts[key] += 1
        return original(self, *args, **kwargs)
    return counted


def test_two_nodes_two_workers_gloo_on_simulated_aws_matches_local(
        aws: AwsWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every DescribeInstances that reaches the moto server is counted there (from this process
    # or a simulated node's); the ones this process (the client) sends are counted through
    # botocore, so what the nodes sent is the difference.
    counts = {"server": 0, "client": 0}
    monkeypatch.setattr(InstanceResponse, "describe_instances", _counting(
        counts, "server", InstanceResponse.describe_instances, lambda: True))
    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", _counting(
        counts, "client", botocore.client.BaseClient._make_api_call,
        lambda operation, *_: operation == "DescribeInstances"))
    sim = FlowApp("sim", provider="aws-sim",
                  provider_config=aws.sim_config())
    on_aws = sim.function(num_instances=2, workers_per_node=2, priority="high")(_allreduce)
    local = FlowApp("loc", provider="local")
    on_local = local.function(num_instances=2, workers_per_node=2)(_allreduce)
    task = on_aws.spawn()
    local_task = on_local.spawn()  # runs while the simulated nodes boot
    try:
        results = results_or_cancel(task, 150)
    finally:
        local_results = results_or_cancel(local_task, 150)
    assert task.status is TaskStatus.SUCCEEDED
    # no node sent a DescribeInstances (the client's own describes, launch and status,
    # reach the counted handler too)
    assert counts["server"] >= counts["client"] > 0
    assert counts["server"] - counts["client"] == 0, counts
    assert task.result() == results[0]

    assert _shape(results) == _shape(local_results) == [
        (10.0, r, 4, r // 2, r % 2) for r in range(4)]

    provider = task.provider
    assert isinstance(provider, AwsSimProvider)
    # the leader is the lowest instance id, at its moto private address mapped onto loopback
    nodes = provider.list_instances(task.task_id)
    assert {r["master"] for r in results} == {nodes[0].address}
    assert nodes[0].address.startswith("127.")
    # teardown: no instance left running in moto, no agent process alive
    assert aws.non_terminated() == []
    assert live_pids(provider, task.task_id) == []
    # results and status went through S3; logs through CloudWatch
    keys = aws.client("s3").list_objects_v2(Bucket="flow-test-bucket",
                                            Prefix=f"flow/tasks/{task.task_id}/")["Contents"]
    names = {k["Key"].rsplit("/", 2)[-2] + "/" + k["Key"].rsplit("/", 1)[-1] for k in keys}
    assert {"results/000000", "results/000003"} <= names
    assert any(n.endswith("outcome.json") for n in names)
    streams = aws.client("logs").describe_log_streams(
        logGroupName=f"/flow/{task.task_id}")["logStreams"]
    assert {s["logStreamName"] for s in streams} >= {"node-0.rank-0", "node-1.rank-3"}
    lines = Task.from_id(task.task_id).logs()  # another handle, from the client record
    assert any("rank 3 reduced 10.0" in line and line.startswith("[Node 1]") for line in lines)
    agent_lines = task.logs(source="agent")
    assert any("all 2 nodes arrived" in line for line in agent_lines)
    assert sum("from its record" in line for line in agent_lines) == 2
    boot_lines = task.logs(source="boot")  # the agents' raw output, shipped by the bootstrap
    assert sum("agent started on" in line for line in boot_lines) == 2


def _fails_on_node_1() -> int:
    import os
    import time

    if os.environ["FLOW_NODE_RANK"] == "1":
        raise ValueError("bad shard on node 1")
    time.sleep(60)  # node 0 is stopped by the failure broadcast, not by finishing
    return 0


def test_a_failing_node_fails_the_task_and_tears_everything_down(aws: AwsWorld) -> None:
    sim = FlowApp("sim", provider="aws-sim",
                  provider_config=aws.sim_config())
    task = sim.function(num_instances=2, priority="high")(_fails_on_node_1).spawn()
    with pytest.raises(ValueError, match="bad shard on node 1") as caught:
        task.result(timeout=120)
    assert not isinstance(caught.value, TaskFailedError)  # the user's own exception type
    outcome = task.outcome()
    assert outcome is not None and outcome.node == 1 and outcome.status == "FAILED"
    assert aws.non_terminated() == []
    assert isinstance(task.provider, AwsSimProvider)
    assert live_pids(task.provider, task.task_id) == []


RESTARTS = 2  # the killed agent's node, then the spot-interrupted leader, replaced


def _resilient() -> dict[str, Any]:
    import time

    import torch
    import torch.distributed as dist

    from flow_sdk import current

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    world = dist.get_world_size()
    if current.restart_count < 2:  # RESTARTS
        print(f"rank {current.rank} ready in generation {current.restart_count}", flush=True)
        time.sleep(300)  # generations 0 and 1 never finish: a node goes first
    dist.destroy_process_group()
    return {"restart": current.restart_count, "sum": float(value.item()), "world": world}


# A distinctive fake secret: whatever credentials the caller has must never reach user-data,
# logs or objects (nodes use their instance profile; simulated nodes inherit the environment).
SECRET_KEY = "flowFAKEsecret0e5b7c1d9a/NeverInUserData+Or+Logs"


def _tags(raw: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}


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
        if any(item.startswith(f"{envvars.SIM_INSTANCE}={task_id}/".encode()) for item in environ):
            found.append(int(proc.name))
    return found


def _is_agent(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return b"flow_sdk.node.agent" in argv


def _task_secret_reaches_only_the_agents(aws: AwsWorld, provider: AwsSimProvider,
                                         task_id: str) -> str:
    """While both nodes run: the task's secret is in no user-data (which names its SSM
    parameter), the SecureString holds it, no node process but the agents holds it, and the
    agents removed the file they read it through. Returns the parameter's name."""
    secret = tasksecrets.load_task_secret(task_id).hex()
    ec2, ssm = aws.client("ec2"), aws.client("ssm")
    for instance in provider.list_instances(task_id):
        answer = ec2.describe_instance_attribute(InstanceId=instance.instance_id,
                                                 Attribute="userData")
        user_data = base64.b64decode(answer["UserData"]["Value"]).decode()
        assert "FLOW_SECRET_PARAMETER=" in user_data and secret not in user_data
    name = role_path(provider.store_tag) + task_id
    stored = ssm.get_parameter(Name=name, WithDecryption=True)["Parameter"]
    assert stored["Type"] == "SecureString" and stored["Value"] == secret
    pids = _node_pids(task_id)
    agents = [pid for pid in pids if _is_agent(pid)]
    others = [pid for pid in pids if pid not in agents]
    assert len(agents) == 2 and len(others) >= 6, (agents, others)  # bash, tee, workers
    for pid in others:
        assert secret not in process_traces(pid), pid
    assert list(aws.sim_root.rglob(".task-secret")) == []  # the agents removed it
    return name


def _ready_in(task: Task, generation: int) -> int:
    return sum(f"ready in generation {generation}" in line for line in task.logs())


def test_a_killed_node_is_replaced_from_the_node_and_the_job_completes(
        aws: AwsWorld, ec2_wire: Wire, monkeypatch: pytest.MonkeyPatch) -> None:
    """Generation 0 loses node 1's agent (SIGKILL): the deciding node launches its
    replacement. Generation 1's leader gets a spot interruption notice: it hosts the
    generation's store, decides its own replacement, and terminates itself last."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    imds = FakeImds().start()
    try:
        sim = FlowApp("sim", provider="aws-sim", provider_config=aws.sim_config(
            imds_endpoint=imds.endpoint + "/{instance_id}"))  # each node's own IMDS
        # spot at a cap between the spot ($0.0731) and on-demand ($0.1785) price of c7i.xlarge
        resilient = sim.function(num_instances=2, max_restarts=RESTARTS, priority="med",
                                 max_price_per_hour=0.10)(_resilient)
        task = resilient.spawn()
        provider = task.provider
        assert isinstance(provider, AwsSimProvider)
        assert isinstance(provider.runtime, SimulatedNodes)
        try:
            # the launch record carries each node's real offer price and market
            raw_launch = provider.store.get(wire.launch_key(task.task_id))
            assert raw_launch is not None
            launch = LaunchRecord.from_json(raw_launch)
            assert [(n.instance_type, n.market, n.usd_per_hour) for n in launch.nodes] == [
                ("c7i.xlarge", "spot", 0.0731)] * 2
            assert {n.instance_id for n in launch.nodes} == {
                i.instance_id for i in provider.list_instances(task.task_id)}
            assert all(n.zone for n in launch.nodes)
            assert task.cost_per_hour == pytest.approx(2 * 0.0731)  # what flow_sdk.client.cost reads

            wait_until(lambda: _ready_in(task, 0) == 2, 120, "both ranks ready", POLL_S)
            parameter = _task_secret_reaches_only_the_agents(aws, provider, task.task_id)
            first = {n.node: n.instance_id for n in task.nodes()}
            lost = first[1]
            os.kill(agent_pid(provider, task.task_id, lost), signal.SIGKILL)

            wait_until(lambda: _ready_in(task, 1) == 2, 180, "both ranks ready again",
                       POLL_S)
            [new] = [i["InstanceId"] for i in aws.instances()
                     if i["InstanceId"] not in first.values()]
            wait_until(lambda: {n.instance_id for n in task.nodes()} == {first[0], new}, 30,
                       "generation 1's node records", POLL_S)
            second = {n.node: n.instance_id for n in task.nodes()}
            interrupted = second[0]  # the leader
            imds.interrupt(interrupted)
            results = task.results(timeout=240)  # a replacement boots: slow on a busy machine
        finally:
            if not task.status.is_terminal:
                task.cancel()
    finally:
        imds.stop()
    assert results == [{"restart": 2, "sum": 3.0, "world": 2}] * 2  # both ranks, regenerated
    assert task.status is TaskStatus.SUCCEEDED

    raw = {i["InstanceId"]: i for i in aws.instances()}
    assert len(raw) == 4  # the gang of 2, and one replacement for each loss
    [kept] = [i for i in second.values() if i != interrupted]
    [newer] = [i for i in raw if i not in {*first.values(), new}]
    assert {n.instance_id for n in task.nodes()} == {kept, newer}
    assert raw[interrupted]["State"]["Name"] == "terminated"
    gang_tags = _tags(raw[first[0]])
    for replacement in (new, newer):
        assert _tags(raw[replacement]) == {**gang_tags, "flow:replacement": _tags(
            raw[replacement])["flow:replacement"]}
        assert raw[replacement]["InstanceLifecycle"] == "spot"
        assert raw[replacement]["Placement"] == raw[first[0]]["Placement"]
        assert raw[replacement]["MetadataOptions"]["HttpTokens"] == "required"
    # launched by the deciding node's process: as it reached moto, spot at the cap, 1 node
    [gang_wire, *node_wires] = ec2_wire.run_instances
    assert gang_wire["MinCount"] == "2" and len(node_wires) == 2
    for node_wire in node_wires:
        assert (node_wire["MinCount"], node_wire["MaxCount"]) == ("1", "1")
        assert node_wire["InstanceMarketOptions.SpotOptions.MaxPrice"] == "0.1000"
        assert Wire.tags(node_wire)["flow:role"] == "node"
    agent_lines = task.logs(source="agent")
    assert any(f"restart 1 of {RESTARTS}" in line and lost in line for line in agent_lines)
    assert any(f"restart 2 of {RESTARTS}" in line and interrupted in line
               for line in agent_lines)

    # zero instances and zero processes left
    assert aws.non_terminated() == []
    assert live_pids(provider, task.task_id) == []
    ssm = aws.client("ssm")
    with pytest.raises(ssm.exceptions.ParameterNotFound):  # the secret went with the task
        ssm.get_parameter(Name=parameter)

    # no secret anywhere: user-data, CloudWatch log events, stored objects, raw boot output
    ec2, logs, s3 = aws.client("ec2"), aws.client("logs"), aws.client("s3")
    scanned: list[str] = []
    for instance_id in raw:
        scanned.append(base64.b64decode(ec2.describe_instance_attribute(
            InstanceId=instance_id, Attribute="userData")["UserData"]["Value"]).decode())
    group = f"/flow/{task.task_id}"
    for stream in logs.describe_log_streams(logGroupName=group)["logStreams"]:
        events = logs.get_log_events(logGroupName=group, logStreamName=stream["logStreamName"],
                                     startFromHead=True)["events"]
        scanned.extend(e["message"] for e in events)
    for obj in s3.list_objects_v2(Bucket=BUCKET)["Contents"]:
        scanned.append(s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read().decode(
            "utf-8", errors="replace"))
    scanned.extend(p.read_text(errors="replace") for p in (aws.sim_root / "boot").rglob("*.log"))
    assert len(scanned) > 20 and sum("agent started on" in text for text in scanned) >= 4
    assert not any(SECRET_KEY in text or SECRET_KEY[:20] in text for text in scanned)
