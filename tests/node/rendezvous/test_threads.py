"""Each worker slot's share of its node's cores."""

from __future__ import annotations

import os

from flow_sdk.node.rendezvous.threads import THREAD_VARS, node_cores, thread_env
from flow_sdk.wire import envvars


def test_share_of_the_cores_per_slot() -> None:
    assert thread_env(16, 4, {}) == {name: "4" for name in THREAD_VARS}
    assert thread_env(2, 4, {})["OMP_NUM_THREADS"] == "1"  # never 0
    assert thread_env(7, 2, {})["MKL_NUM_THREADS"] == "3"


def test_user_values_are_left_alone() -> None:
    env = thread_env(16, 2, {"OMP_NUM_THREADS": "3"})
    assert "OMP_NUM_THREADS" not in env and env["MKL_NUM_THREADS"] == "8"


def test_node_cores_from_the_provider_else_this_process() -> None:
    assert node_cores({envvars.NODE_CORES: "6"}) == 6
    mine = len(os.sched_getaffinity(0))
    assert node_cores({envvars.NODE_CORES: "0"}) == mine
    assert node_cores({envvars.NODE_CORES: "many"}) == mine
    assert node_cores({}) == mine
