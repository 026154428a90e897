"""A launcher killed the instant a node's first process started: the provider recorded the
node before starting it, so ``flow gc`` finds the half-made pool's node and stops every one of
its processes (no process carries this test's FLOW_HOME afterwards)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from flow_testing import processes_with_env, wait_until

from flow_sdk import lifecycle
from flow_sdk.home import poolfiles
from flow_sdk.testing import ProviderUnderTest

# Runs ``pool_up`` and dies (os._exit: no cleanup runs) as soon as the provider has started
# a node's own process: the local node's agent, or the simulated instance.
LAUNCHER = """
import json, os, subprocess, sys
from flow_sdk.client.pools import pool_up

NODE_PROCESSES = ("flow_sdk.node.pool", "flow_sdk.sim._instance")

class DiesAfterANode(subprocess.Popen):
    def __init__(self, args, *rest, **options):
        super().__init__(args, *rest, **options)
        if any(module in args for module in NODE_PROCESSES):
            os._exit(9)

subprocess.Popen = DiesAfterANode
pool_up("cut", provider=sys.argv[1], provider_config=json.loads(sys.argv[2]), num_instances=2)
"""


@pytest.mark.slow  # the providers with pools whose nodes start as processes here
@pytest.mark.parametrize("provider_under_test", ["local", "aws-sim"], indirect=True)
def test_gc_stops_a_node_whose_launcher_died_as_it_started(
        provider_under_test: ProviderUnderTest, flow_home: Path) -> None:
    launcher = subprocess.run([sys.executable, "-c", LAUNCHER, provider_under_test.name,
                               json.dumps(provider_under_test.config)], capture_output=True,
                              text=True, timeout=180)
    assert launcher.returncode == 9, launcher.stdout + launcher.stderr
    [pool] = poolfiles.list_pool_files()
    provider = provider_under_test.provider()
    assert "running" in [i.state for i in provider.list_instances(pool.pool_id)]
    assert processes_with_env("FLOW_HOME", str(flow_home)), "the node's process runs"

    report = lifecycle.collect(provider, known=())
    assert pool.pool_id in report.reasons, report
    wait_until(lambda: processes_with_env("FLOW_HOME", str(flow_home)) == [], 30,
               "every process of the half-launched node stopped")
    assert {i.state for i in provider.list_instances(pool.pool_id)} == {"terminated"}
