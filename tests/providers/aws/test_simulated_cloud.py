"""The simulated cloud: a whole ``.remote()`` through ``provider="aws-sim"`` over real boto3/HTTP.

moto's instances boot here through the real bootstrap: launch (run_instances), discovery
(describe_instances), payload from S3, rendezvous, a real gloo all-reduce, results to S3, logs
to CloudWatch, teardown. The same function on ``provider="local"`` must give the same result.
Node replacement under ``max_restarts``: a node's agent killed with SIGKILL is replaced by a
node launched from the deciding node's own process, and the job completes.
"""

from __future__ import annotations

import base64
import os
import signal
from typing import Any

import pytest
from aws_moto_world import BUCKET, AwsWorld, Wire, agent_pid, live_pids
from flow_testing import results_or_cancel, wait_until

from flow_sdk import FlowApp, Task, TaskFailedError, TaskStatus, wire
from flow_sdk.wire import LaunchRecord
from flow_sdk.sim import AwsSimProvider, SimulatedNodes
from fake_imds import FakeImds

pytestmark = pytest.mark.slow


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


def test_two_nodes_two_workers_gloo_on_simulated_aws_matches_local(aws: AwsWorld) -> None:
    sim = FlowApp("sim", provider="aws-sim",
                  provider_config=aws.sim_config())
    on_aws = sim.function(num_instances=2, workers_per_node=2, priority="high")(_allreduce)
    task = on_aws.spawn()
    results = results_or_cancel(task, 150)
    assert task.status is TaskStatus.SUCCEEDED
    assert task.result() == results[0]

    local = FlowApp("loc", provider="local")
    on_local = local.function(num_instances=2, workers_per_node=2)(_allreduce)
    local_results = on_local.spawn().results(timeout=150)
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


def _resilient() -> dict[str, Any]:
    import time

    import torch
    import torch.distributed as dist

    from flow_sdk import current

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    world = dist.get_world_size()
    if current.restart_count == 0:
        print(f"rank {current.rank} ready", flush=True)
        time.sleep(300)  # generation 0 never finishes: a node dies first
    dist.destroy_process_group()
    return {"restart": current.restart_count, "sum": float(value.item()), "world": world}


# A distinctive fake secret: whatever credentials the caller has must never reach user-data,
# logs or objects (nodes use their instance profile; simulated nodes inherit the environment).
SECRET_KEY = "flowFAKEsecret0e5b7c1d9a/NeverInUserData+Or+Logs"


def _tags(raw: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}


def test_a_killed_node_is_replaced_from_the_node_and_the_job_completes(
        aws: AwsWorld, ec2_wire: Wire, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    sim = FlowApp("sim", provider="aws-sim",
                  provider_config=aws.sim_config())
    # spot at a cap between the spot ($0.0731) and on-demand ($0.1785) price of c7i.xlarge
    resilient = sim.function(num_instances=2, max_restarts=1, priority="med",
                             max_price_per_hour=0.10)(_resilient)
    task = resilient.spawn()
    provider = task.provider
    assert isinstance(provider, AwsSimProvider) and isinstance(provider.runtime, SimulatedNodes)
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
        assert task.cost_per_hour == pytest.approx(2 * 0.0731)  # what flow_sdk.cost reads

        wait_until(lambda: sum("ready" in line for line in task.logs()) == 2, 120,
                   "both ranks ready")
        first = {n.node: n.instance_id for n in task.nodes()}
        lost = first[1]
        os.kill(agent_pid(provider, task.task_id, lost), signal.SIGKILL)
        results = task.results(timeout=180)
    finally:
        if not task.status.is_terminal:
            task.cancel()
    assert results == [{"restart": 1, "sum": 3.0, "world": 2}] * 2  # both ranks, regenerated

    raw = {i["InstanceId"]: i for i in aws.instances()}
    assert len(raw) == 3  # the gang of 2, and one replacement
    [new] = [i for i in raw if i not in first.values()]
    assert {n.instance_id for n in task.nodes()} == {first[0], new}
    gang_tags = _tags(raw[first[0]])
    assert _tags(raw[new]) == {**gang_tags, "flow:replacement": _tags(raw[new])[
        "flow:replacement"]}
    assert raw[new]["InstanceLifecycle"] == "spot"
    assert raw[new]["Placement"] == raw[first[0]]["Placement"]
    assert raw[new]["MetadataOptions"]["HttpTokens"] == "required"
    # launched by the deciding node's process: as it reached moto, spot at the cap, 1 node
    [gang_wire, node_wire] = ec2_wire.run_instances
    assert (gang_wire["MinCount"], node_wire["MinCount"], node_wire["MaxCount"]) == (
        "2", "1", "1")
    assert node_wire["InstanceMarketOptions.SpotOptions.MaxPrice"] == "0.1000"
    assert Wire.tags(node_wire)["flow:role"] == "node"
    agent_lines = task.logs(source="agent")
    assert any("restart 1 of 1" in line and lost in line for line in agent_lines)

    # zero instances and zero processes left
    assert aws.non_terminated() == []
    assert live_pids(provider, task.task_id) == []

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
    assert len(scanned) > 20 and sum("agent started on" in text for text in scanned) >= 3
    assert not any(SECRET_KEY in text or SECRET_KEY[:20] in text for text in scanned)


def test_a_spot_interruption_notice_replaces_the_node(aws: AwsWorld) -> None:
    # The leader gets the notice: it hosts the generation's store, decides its own
    # replacement, and terminates itself last.
    imds = FakeImds().start()
    try:
        sim = FlowApp("sim", provider="aws-sim", provider_config=aws.sim_config(
            imds_endpoint=imds.endpoint + "/{instance_id}"))  # each node's own IMDS
        resilient = sim.function(num_instances=2, max_restarts=1, priority="med",
                                 max_price_per_hour=0.10)(_resilient)
        task = resilient.spawn()
        try:
            wait_until(lambda: sum("ready" in line for line in task.logs()) == 2, 120,
                       "both ranks ready")
            first = {n.node: n.instance_id for n in task.nodes()}
            imds.interrupt(first[0])
            results = task.results(timeout=240)  # a replacement boots: slow on a busy machine
        finally:
            if not task.status.is_terminal:
                task.cancel()
    finally:
        imds.stop()
    assert results == [{"restart": 1, "sum": 3.0, "world": 2}] * 2
    states = {i["InstanceId"]: i["State"]["Name"] for i in aws.instances()}
    assert len(states) == 3 and states[first[0]] == "terminated"
    assert first[0] not in {n.instance_id for n in task.nodes()}
    assert aws.non_terminated() == []
