"""The simulated cloud's nodes learn their gang from the launcher's membership record: no
DescribeInstances reaches EC2 from a node for discovery.

Every DescribeInstances that reaches the moto server is counted there (from this process or a
simulated node's); the ones this process (the client) sends are counted through botocore, so
what the nodes sent is the difference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import botocore.client
import pytest
from flow_testing import results_or_cancel
from aws_moto_world import AwsWorld
from moto.ec2.responses.instances import InstanceResponse

from flow_sdk import FlowApp, TaskStatus

pytestmark = pytest.mark.slow


def _node() -> int:
    import os
    return int(os.environ["FLOW_NODE_RANK"])


def _counting(counts: dict[str, int], key: str, original: Callable[..., Any],
              wanted: Callable[..., bool]) -> Callable[..., Any]:
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        if wanted(*args):
            counts[key] += 1
        return original(self, *args, **kwargs)
    return counted


def test_simulated_nodes_make_no_describe_instances_for_discovery(
        aws: AwsWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = {"server": 0, "client": 0}
    monkeypatch.setattr(InstanceResponse, "describe_instances", _counting(
        counts, "server", InstanceResponse.describe_instances, lambda: True))
    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", _counting(
        counts, "client", botocore.client.BaseClient._make_api_call,
        lambda operation, *_: operation == "DescribeInstances"))
    sim = FlowApp("sim", provider="aws-sim",
                  provider_config=aws.sim_config())
    task = sim.function(num_instances=2, priority="high")(_node).spawn()
    results = results_or_cancel(task, 150)
    assert task.status is TaskStatus.SUCCEEDED and results == [0, 1]
    # the client's own describes (launch, status) reach the counted handler too
    assert counts["server"] >= counts["client"] > 0
    assert counts["server"] - counts["client"] == 0, counts
    agent_lines = task.logs(source="agent")
    assert sum("from its record" in line for line in agent_lines) == 2
