"""Pools on the simulated cloud: the real bootstrap starts each node's pool daemon, the node's
own OS timer (``shutdown -h +N``, minutes of ``minute_s`` seconds) stops it after its idle time
with no client left, ``flow gc`` reclaims a pool whose ``pool up`` was killed, and a spare takes
a lost node's rank with no boot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from aws_moto_world import AwsWorld, live_pids
from flow_testing import wait_until
from seeded_ddp import train

from flow_sdk import FlowApp
from flow_sdk.client.pools import Pool, pool_up
from flow_sdk.sim import AwsSimProvider

pytestmark = pytest.mark.slow

# Each poll of a wait here asks the moto server (which runs in this process) or reads /proc:
# at wait_until's default 20 per second, the polling alone costs seconds of CPU a test.
POLL_S = 0.5

UP_SCRIPT = """
import json, sys, time
from flow_sdk.client.pools import pool_up
pool = pool_up("idle", provider="aws-sim", provider_config=json.loads(sys.argv[1]),
               num_instances=1, idle_stop="20m")
print(pool.pool_id, flush=True)
time.sleep(3600)
"""


def _mounts_under(root: Path) -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4] for line in lines if line.split()[4].startswith(str(root))]


def test_the_nodes_stop_at_their_idle_stop_with_the_client_killed(aws: AwsWorld) -> None:
    config = aws.sim_config(minute_s=0.5)  # "20m" is 20 simulated minutes of 0.5 s
    client = subprocess.Popen([sys.executable, "-c", UP_SCRIPT, json.dumps(config)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None
        pool_id = client.stdout.readline().strip()
        assert pool_id.startswith("idle-"), pool_id
        assert len(aws.non_terminated()) == 1
    finally:
        client.send_signal(signal.SIGKILL)  # the caller is gone: no client stops the pool
        client.wait()
    wait_until(lambda: aws.non_terminated() == [], 90, "the nodes' own idle stop", POLL_S)
    provider = AwsSimProvider.from_config(config)
    wait_until(lambda: live_pids(provider, pool_id) == [], 30, "every node process gone",
               POLL_S)
    assert _mounts_under(aws.sim_root) == []
    nodes = aws.sim_root / "nodes" / pool_id  # each instance's own folder, kept after it

    def logs(kind: str) -> str:
        return "".join(p.read_text(errors="replace") for p in nodes.glob(f"i-*/{kind}.log"))

    assert logs("console").count("idle stop after 1200s by the OS's shutdown timer") == 1
    assert logs("instance").count("terminated through EC2 (the node powered off)") == 1


def test_gc_reclaims_a_pool_whose_pool_up_was_killed(aws: AwsWorld) -> None:
    config = json.dumps(aws.sim_config())
    up = subprocess.Popen(["flow", "pool", "up", "half", "-N", "1", "--provider", "aws-sim",
                           "--provider-config", config], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    wait_until(lambda: len(aws.non_terminated()) == 1, 120, "the half pool's instance",
               0.1)  # killed before the pool is ready
    up.send_signal(signal.SIGKILL)
    up.wait()
    pool = Pool.named("half")
    gc = subprocess.run(["flow", "gc"], capture_output=True, text=True, timeout=300)
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert "half-made pool half" in gc.stdout
    wait_until(lambda: aws.non_terminated() == [], 60, "every instance terminated", POLL_S)
    provider = pool.provider
    assert isinstance(provider, AwsSimProvider)
    wait_until(lambda: live_pids(provider, pool.pool_id) == [], 30, "every node process gone",
               POLL_S)
    assert _mounts_under(aws.sim_root) == []
    assert subprocess.run(["flow", "pool", "list"], capture_output=True, text=True,
                          timeout=60).stdout.count("half") == 0


def test_a_spare_takes_the_rank_of_a_node_whose_agent_was_killed(aws: AwsWorld,
                                                                  tmp_path: Path) -> None:
    config = aws.sim_config()
    app = FlowApp("sim-spare", provider="aws-sim", provider_config=config)
    trainer = app.function(num_instances=2, max_restarts=1, pool="spare", quiet=True)(train)
    pool = pool_up("spare", provider="aws-sim", provider_config=config, num_instances=2,
                   spares=1, idle_stop="30m")
    try:
        (tmp_path / "reference").mkdir()
        (tmp_path / "resumed").mkdir()
        reference = trainer.spawn(10, str(tmp_path / "reference")).result(timeout=300)
        task = trainer.spawn(10, str(tmp_path / "resumed"))
        wait_until(lambda: any("step 3" in line for line in task.logs()), 120, "step 3")
        gang = {n.node: n.instance_id for n in task.nodes()}
        os.kill(pool.members()[gang[1]].agent_pid, signal.SIGKILL)
        resumed = task.result(timeout=300)
        assert resumed == pytest.approx(reference, abs=1e-6)
        spare = ({i.instance_id for i in task.instances()} - set(gang.values())).pop()
        # the spare joined the gang in node 1's place (ranks follow sorted instance ids)
        assert {n.instance_id for n in task.nodes()} == {gang[0], spare}
        assert len(aws.instances()) == 3  # no node was booted for the task
        # node 1 lost only its agent: its daemon swept it, and it stands by for the next task
        wait_until(lambda: [m.state for m in pool.members().values()] == ["idle"] * 3, 60,
                   "every pool node idle", POLL_S)
    finally:
        pool.down()
    wait_until(lambda: aws.non_terminated() == [], 60, "every instance terminated", POLL_S)
