"""What a task costs: each node's hourly price x the time from launch to the task's end.

Live while the task runs (``now`` is the end), final once it ended (its outcome's time).
"""

from __future__ import annotations

from flow_sdk.wire import LaunchRecord


def cost_per_hour(launch: LaunchRecord) -> float:
    """USD per hour for all of the task's nodes together."""
    return sum(node.usd_per_hour for node in launch.nodes)


def estimated_cost(launch: LaunchRecord, finished_at: float | None, now: float) -> float:
    """USD spent so far (or in all, once ``finished_at`` is known)."""
    end = finished_at if finished_at is not None else now
    return cost_per_hour(launch) * max(0.0, end - launch.launched_at) / 3600.0
