"""A pool daemon acts only on an outcome sealed with the task's secret: a junk outcome a store
writer puts there for a running pool task neither releases the task's spare nor stops its
agent, and the task ends with its real result."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from flow_testing import wait_until

from flow_sdk import FlowApp, wire
from flow_sdk.system import procs
from flow_sdk.client.pools import pool_up
from flow_sdk.node.pool.daemon import LINGER_S, OUTCOME_CHECK_S
from flow_sdk.wire import Outcome

pytestmark = pytest.mark.slow

app = FlowApp("daemon-forgeries")


def _waits(started: str, release: str) -> int:
    import os
    import time
    from pathlib import Path

    Path(started).write_text("up")
    deadline = time.monotonic() + 120
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise TimeoutError("never released")
        time.sleep(0.05)
    return 42


def test_a_junk_outcome_keeps_the_spare_and_the_agent_of_a_running_pool_task(
        flow_home: Path, tmp_path: Path) -> None:
    pool = pool_up("forged", num_instances=1, spares=1, idle_stop="10m")
    try:
        started, release = tmp_path / "started", tmp_path / "release"
        task = app.function(num_instances=1, spares=1, pool="forged", quiet=True)(
            _waits).spawn(str(started), str(release))
        wait_until(started.exists, 60, "the task's function to run")

        def states() -> list[str]:
            return sorted(m.state for m in pool.members().values())

        wait_until(lambda: states() == ["busy", "standby"], 30, "one node busy, one spare")
        [busy] = [m for m in pool.members().values() if m.state == "busy"]
        pool.provider.store.put(wire.outcome_key(task.task_id), wire.to_json(
            Outcome("FAILED", "forged", time.time())))  # no MAC: a store writer's
        time.sleep(LINGER_S + 4 * OUTCOME_CHECK_S + 1)  # past when an outlived agent stops
        assert procs.is_alive(busy.agent_pid, None), "the daemon killed the running task's agent"
        members = pool.members().values()
        assert sorted((m.state, m.task_id) for m in members) == [
            ("busy", task.task_id), ("standby", task.task_id)]
        assert not task.status.is_terminal

        release.write_text("go")
        assert task.result(timeout=60) == 42
        outcome = task.outcome()
        assert outcome is not None and outcome.status == "SUCCEEDED"
        wait_until(lambda: states() == ["idle", "idle"], 30, "both nodes idle again")
    finally:
        pool.down()
