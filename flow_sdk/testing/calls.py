"""The functions the contract suite runs on nodes: importable without pytest (a node has the
SDK's wheel and its dependencies only)."""

from __future__ import annotations

import time
from typing import Any

from flow_sdk import current


def where_am_i() -> dict[str, Any]:
    """This worker's place in the gang, as the rendezvous gave it."""
    return {"rank": current.rank, "world": current.world_size, "node": current.node_index,
            "leader": current.main_ip}


def sleeps(seconds: float = 600.0) -> None:
    time.sleep(seconds)
