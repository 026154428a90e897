"""The local node's keeper holds the task's runtime cap when no agent can: past its deadline,
with the agent frozen, it stops every process of the node, as a cloud node's power-off timer
would, and the caller need not be alive for that."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flow_testing import wait_until

from flow_sdk.system import procs
from flow_sdk.providers.local import _keeper
from flow_sdk.wire import envvars


def _frozen_node(tmp_path: Path, instance_id: str, deadline: float | None
                 ) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], Path]:
    """A stand-in agent (a sleeping Python writing into the keeper's stdin) and its keeper."""
    env = {**os.environ, envvars.INSTANCE_ID: instance_id}
    env.pop(envvars.NODE_DEADLINE, None)
    if deadline is not None:
        env[envvars.NODE_DEADLINE] = repr(deadline)
    stream = tmp_path / "boot.stream"
    read_end, write_end = os.pipe()
    keeper = subprocess.Popen(_keeper.keeper_argv(sys.executable, stream, instance_id, []),
                              env=env, stdin=read_end, start_new_session=True)
    agent = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); "
                              "time.sleep(600)"], env=env, stdout=write_end,
                             start_new_session=True)
    os.close(read_end)
    os.close(write_end)
    return agent, keeper, stream


def test_past_the_deadline_the_keeper_stops_a_frozen_node(tmp_path: Path) -> None:
    agent, keeper, stream = _frozen_node(tmp_path, "i-capped", time.time() + 1.5)
    try:
        wait_until(lambda: stream.exists() and "up" in stream.read_text(), 20, "the agent up")
        agent.send_signal(signal.SIGSTOP)  # frozen: it can enforce nothing
        assert keeper.wait(timeout=20) == 0
        assert agent.wait(timeout=5) == -signal.SIGKILL
        text = stream.read_text()
        assert "the task's runtime cap passed" in text and "stopped 1 process(es)" in text
        assert procs.pids_with_env(envvars.INSTANCE_ID, ["i-capped"]) == []
    finally:
        procs.stop_pids([p.pid for p in (agent, keeper) if p.poll() is None])


def test_without_a_deadline_the_keeper_waits_for_the_agent(tmp_path: Path) -> None:
    agent, keeper, stream = _frozen_node(tmp_path, "i-uncapped", None)
    try:
        wait_until(lambda: stream.exists() and "up" in stream.read_text(), 20, "the agent up")
        agent.send_signal(signal.SIGSTOP)
        time.sleep(2.0)
        assert keeper.poll() is None and agent.poll() is None  # no cap: nothing stops it
    finally:
        procs.stop_pids([p.pid for p in (agent, keeper) if p.poll() is None])
        for process in (agent, keeper):
            process.wait(timeout=10)
