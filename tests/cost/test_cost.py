from __future__ import annotations

import pytest

from flow_sdk.cost import cost_per_hour, estimated_cost
from flow_sdk.protocol import LaunchedNode, LaunchRecord


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
