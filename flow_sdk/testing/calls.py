"""The functions the contract suite runs on nodes: importable without pytest (a node has the
SDK's wheel and its dependencies only)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from flow_sdk import current
from flow_sdk.wire import envvars

VOLUME_WAIT_S = 120.0  # how long a node waits to see every node's file on a shared volume


def where_am_i() -> dict[str, Any]:
    """This worker's place in the gang, as the rendezvous gave it."""
    return {"rank": current.rank, "world": current.world_size, "node": current.node_index,
            "leader": current.main_ip}


def sleeps(seconds: float = 600.0) -> None:
    time.sleep(seconds)


def loses_its_second_node() -> dict[str, Any]:
    """In the first generation node 1 loses its agent (killed: the node is lost, its worker
    goes with it) and node 0 waits; in the next, with a replacement node, both return."""
    if current.restart_count == 0:
        if current.node_index == 1:
            os.kill(int(os.environ[envvars.AGENT_PID]), signal.SIGKILL)
        time.sleep(600)
    return {"restart": current.restart_count, "node": current.node_index}


def shares_a_volume(mount: str) -> list[str]:
    """Each node writes a file of its own on the file volume at ``mount``, then waits until
    it sees every node's there."""
    folder = Path(current.path(mount, write=True))
    (folder / f"node-{current.node_index}").write_text(current.task_id)
    deadline = time.monotonic() + VOLUME_WAIT_S
    while len(seen := sorted(p.name for p in folder.glob("node-*"))) < current.num_nodes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {current.node_index} saw only {seen} on {mount} after "
                               f"{VOLUME_WAIT_S:g} s")
        time.sleep(0.2)
    return seen
