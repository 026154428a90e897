"""What code running inside a task can ask about its place in it (Metaflow's ``current``).

    from flow_sdk import current
    if current.is_main: ...

Every attribute reads the environment the node agent set. Outside a task they describe a
single process (rank 0 of 1), so the same code runs under a plain ``fn()`` call.
"""

from __future__ import annotations

import os

__all__ = ["task_id", "node_index", "num_nodes", "main_ip", "rank", "local_rank", "world_size",
           "local_world_size", "is_main", "restart_count", "in_task"]


def _int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def _read(name: str) -> object:
    if name == "task_id":
        return os.environ.get("FLOW_TASK_ID")
    if name == "in_task":
        return "FLOW_TASK_ID" in os.environ
    if name == "node_index":
        return _int("FLOW_NODE_RANK", 0)
    if name == "num_nodes":
        return _int("FLOW_NUM_NODES", 1)
    if name == "main_ip":
        return os.environ.get("FLOW_MAIN_IP", "127.0.0.1")
    if name == "rank":
        return _int("RANK", _int("FLOW_NODE_RANK", 0))
    if name == "local_rank":
        return _int("LOCAL_RANK", 0)
    if name == "world_size":
        return _int("WORLD_SIZE", _int("FLOW_NUM_NODES", 1))
    if name == "local_world_size":
        return _int("LOCAL_WORLD_SIZE", 1)
    if name == "is_main":
        return _read("rank") == 0
    if name == "restart_count":
        return _int("FLOW_RESTART_COUNT", 0)
    raise AttributeError(f"flow_sdk.current has no attribute {name!r}; available: {', '.join(__all__)}")


def __getattr__(name: str) -> object:
    return _read(name)


def __dir__() -> list[str]:
    return sorted(__all__)
