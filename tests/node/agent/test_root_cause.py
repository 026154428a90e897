"""The stall default and the root cause among failure reports: "auto" stays at most half of the
collective timeout; a stall timed at its rank's last progress comes before the collective
timeouts it caused, and when the runtime cap ended the task, the cap's report names it."""

from __future__ import annotations

from flow_sdk.node.agent.failures import consequences, first_with_others, root_cause
from flow_sdk.node.agent.stall import auto_timeout
from flow_sdk.node.rendezvous.store import FailureReport


def test_auto_is_at_most_half_the_collective_timeout() -> None:
    assert auto_timeout(600.0, []) == 120.0  # the floor, under the defaults
    assert auto_timeout(600.0, [50.0, 70.0, 60.0]) == 300.0  # 5 steps, capped at half
    assert auto_timeout(600.0, [30.0]) == 150.0
    assert auto_timeout(30.0, []) == 15.0
    assert auto_timeout(30.0, [100.0]) == 15.0


def _stall(at: float) -> FailureReport:
    return FailureReport(node=0, status="FAILED", rank=1, observed_at=at, label="user",
                         message="stall: rank 1 made no progress since 10:00:00 UTC (30s)\n"
                                 "== rank 1 (node 0, faulthandler)")


def _timeout(node: int, rank: int, at: float) -> FailureReport:
    return FailureReport(node=node, status="FAILED", rank=rank, observed_at=at, label="user",
                         exit_code=1, has_error_payload=True,
                         message=f"node {node} rank {rank}: worker raised RuntimeError: Timed "
                                 "out waiting 30000ms for recv operation to complete")


def _cap(node: int, at: float) -> FailureReport:
    return FailureReport(node=node, status="TIMED_OUT", observed_at=at, label="user",
                         message="the task reached its max_run_time_hours cap and was stopped "
                                 "on the nodes")


def test_a_stall_comes_before_the_collective_timeouts_it_caused() -> None:
    node0 = first_with_others([_timeout(0, 0, 130.0), _stall(100.0)])
    assert node0 is not None and node0.rank == 1 and node0.message.startswith("stall: rank 1")
    reports = [node0, first_with_others([_timeout(1, 2, 130.2), _timeout(1, 3, 130.3)])]
    root, _ = root_cause([r for r in reports if r is not None])
    assert root == node0
    assert [line.split(":")[0] for line in consequences(root, reports)] == [
        "node 0 rank 0", "node 1 rank 2", "node 1 rank 3"]


def test_the_runtime_cap_s_report_names_the_stall_before_it() -> None:
    node0 = first_with_others([_cap(0, 190.0), _stall(100.0)])
    assert node0 is not None and node0.status == "TIMED_OUT"
    assert (node0.node, node0.rank) == (0, 1) and not node0.others
    assert node0.message.startswith("the task reached its max_run_time_hours cap")
    assert "before it, node 0 rank 1: stall: rank 1 made no progress" in node0.message
    assert node0.message.endswith("(30s)\n== rank 1 (node 0, faulthandler)")
    reports = [node0, _cap(1, 190.1)]
    root, _ = root_cause(reports)
    assert root == node0 and consequences(root, reports) == []
    # a node that learned of the cap from the store reports the stall alone: same outcome
    root, merged = root_cause([_stall(100.0), _cap(1, 190.1)])
    assert root.status == "TIMED_OUT" and root.rank == 1 and len(merged) == 2
    assert consequences(root, [_stall(100.0), _cap(1, 190.1)]) == []


def test_a_nodes_own_cap_after_its_error_is_no_consequence_of_a_timed_out_task() -> None:
    """Node 1's worker lost its connection when the cap stopped node 0, then node 1's own cap
    came: its report carries that cap among its others. The task timed out on the stall, so
    the peer's error is a consequence and no node's cap is (a clean run listed it once)."""
    node0 = first_with_others([_cap(0, 190.0), _stall(100.0)])
    assert node0 is not None
    node1 = first_with_others([_timeout(1, 3, 190.2), _cap(1, 190.3)])
    assert node1 is not None and len(node1.others) == 1  # its cap, merged into its report
    root, _ = root_cause([node0, node1])
    assert root.status == "TIMED_OUT" and root.rank == 1
    lines = consequences(root, [node0, node1])
    assert [line.split(":")[0] for line in lines] == ["node 1 rank 3"]


def test_a_failure_before_the_cap_stays_the_root_cause() -> None:
    reports = [_timeout(1, 2, 130.2), _timeout(0, 0, 130.0), _cap(1, 130.5)]
    root, merged = root_cause(reports)
    assert root == reports[1] and merged == [reports[1]]
    assert [line.split(":")[0] for line in consequences(root, reports)] == [
        "node 1 rank 2", "node 1"]
