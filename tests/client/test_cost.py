from __future__ import annotations

import pytest

from flow_sdk.client.cost import cost_per_hour, estimated_cost
from flow_sdk.wire import LaunchedNode, LaunchRecord


def _launch(prices: list[float], at: float = 1_000.0) -> LaunchRecord:
    return LaunchRecord(at, [LaunchedNode(f"i-{n}", "p5.48xlarge", "on-demand", p)
                             for n, p in enumerate(prices)])


def test_cost_is_hourly_times_nodes_times_elapsed_within_one_percent() -> None:
    launch = _launch([55.04] * 4)
    clock = 1_000.0 + 1.5 * 3600  # a fake clock 90 minutes after launch
    expected = 55.04 * 4 * 1.5
    assert cost_per_hour(launch) == pytest.approx(55.04 * 4)
    assert estimated_cost(launch, None, now=clock) == pytest.approx(expected, rel=0.01)


def test_cost_is_live_while_running_and_final_after() -> None:
    launch = _launch([2.0, 3.0])
    assert estimated_cost(launch, None, now=1_000.0 + 3600) == pytest.approx(5.0)
    assert estimated_cost(launch, None, now=1_000.0 + 7200) == pytest.approx(10.0)
    final = estimated_cost(launch, finished_at=1_000.0 + 1800, now=1_000.0 + 99_999)
    assert final == pytest.approx(2.5)
    assert estimated_cost(launch, None, now=0.0) == 0.0  # a clock before launch costs nothing


def test_local_nodes_cost_nothing() -> None:
    assert estimated_cost(_launch([0.0, 0.0]), None, now=99_999.0) == 0.0


def test_task_cost_reads_the_launch_record_with_a_fake_clock(flow_home) -> None:
    from flow_sdk import wire
    from flow_sdk.home import tasksecrets
    from flow_sdk.wire import signing
    from flow_sdk.wire import Outcome
    from flow_sdk.providers.local import LocalProvider
    from flow_sdk.client.task import Task

    provider = LocalProvider()
    tasksecrets.save_task_secret("priced-task", signing.new_secret())  # as launch_task does
    task = Task("priced-task", provider)
    assert task.cost_per_hour == 0.0 and task.cost_so_far(now=5_000.0) == 0.0  # not launched
    task.store.put_record(wire.launch_key("priced-task"), _launch([12.5] * 2))
    assert task.cost_per_hour == pytest.approx(25.0)
    assert task.cost_so_far(now=1_000.0 + 7200) == pytest.approx(50.0, rel=0.01)  # running
    task.store.put_record(wire.outcome_key("priced-task"),
                          Outcome("SUCCEEDED", "done", finished_at=1_000.0 + 3600))
    assert task.cost_so_far(now=1_000.0 + 99_999) == pytest.approx(25.0, rel=0.01)  # final
    assert task.estimated_cost == pytest.approx(25.0, rel=0.01)
