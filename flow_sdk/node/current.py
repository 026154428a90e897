"""What code running inside a task can ask about its place in it (Metaflow's ``current``).

    from flow_sdk import current
    if current.is_main: ...

Every attribute reads the environment the node agent set. Outside a task they describe a
single process (rank 0 of 1), so the same code runs under a plain ``fn()`` call.

Volumes and S3 mounts: ``current.path("/shared/ckpt")`` is where this process finds the mount
path ``/shared/ckpt`` (and anything under it). On cloud nodes, and on local nodes that have a
private mount namespace, that is the path itself; where local nodes cannot have one, it is the
volume's directory under the flow data dir (see ``flow_sdk.volumes``). Code that goes through
``current.path`` runs unchanged everywhere. ``current.path(p, write=True)`` also refuses a path
on a read-only S3 mount with ``ReadOnlyMountError`` (``errno.EROFS``). ``current.mounts`` maps
every mount path of the task to the path used for it.
"""

from __future__ import annotations

import os
import time

from flow_sdk.volumes.paths import mounts as _mounts
from flow_sdk.volumes.paths import path
from flow_sdk.wire import envvars

__all__ = ["task_id", "node_index", "num_nodes", "main_ip", "rank", "local_rank", "world_size",
           "local_world_size", "is_main", "restart_count", "in_task", "mounts", "path",
           "parallel", "step"]


class Parallel:
    """Metaflow's ``current.parallel``: the same values as ``current``, under Metaflow's
    names. ``control_task_id`` is the task's id (every node of a flow task belongs to one
    task, whose node 0 is the control node)."""

    @property
    def main_ip(self) -> str:
        """The control node's (node 0's) address."""
        return str(_read("main_ip"))

    @property
    def node_index(self) -> int:
        """This node's index: 0 on the control node."""
        return _int(envvars.NODE_RANK, 0)

    @property
    def num_nodes(self) -> int:
        """Nodes in the task."""
        return _int(envvars.NUM_NODES, 1)

    @property
    def control_task_id(self) -> str | None:
        """The task's id (``None`` outside a task)."""
        value = _read("task_id")
        return value if isinstance(value, str) else None

    def __repr__(self) -> str:
        return (f"Parallel(main_ip={self.main_ip!r}, node_index={self.node_index}, "
                f"num_nodes={self.num_nodes})")


_PARALLEL = Parallel()
_progress_fd: int | None = None


def step(n: int) -> None:
    """Report that this rank reached training step ``n``: the node agent counts it as
    progress (a rank with neither output nor steps for ``stall_timeout`` is stalled) and
    learns the step interval from it. Costs one small write; a no-op outside a task."""
    global _progress_fd
    path = os.environ.get(envvars.PROGRESS_PATH)
    if not path:
        return
    if _progress_fd is None:
        _progress_fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    line = f"{int(n)} {time.time():.6f}\n".encode()
    os.pwrite(_progress_fd, line.ljust(48), 0)  # one fixed-size record, rewritten in place

def _int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def _read(name: str) -> object:
    if name == "task_id":
        return os.environ.get(envvars.TASK_ID)
    if name == "in_task":
        return envvars.TASK_ID in os.environ
    if name == "node_index":
        return _int(envvars.NODE_RANK, 0)
    if name == "num_nodes":
        return _int(envvars.NUM_NODES, 1)
    if name == "main_ip":
        return os.environ.get(envvars.MAIN_IP, "127.0.0.1")
    if name == "rank":
        return _int("RANK", _int(envvars.NODE_RANK, 0))
    if name == "local_rank":
        return _int("LOCAL_RANK", 0)
    if name == "world_size":
        return _int("WORLD_SIZE", _int(envvars.NUM_NODES, 1))
    if name == "local_world_size":
        return _int("LOCAL_WORLD_SIZE", 1)
    if name == "is_main":
        return _read("rank") == 0
    if name == "restart_count":
        return _int(envvars.RESTART_COUNT, 0)
    if name == "parallel":
        return _PARALLEL
    if name == "mounts":
        return _mounts()
    raise AttributeError(f"flow_sdk.current has no attribute {name!r}; available: {', '.join(__all__)}")


def __getattr__(name: str) -> object:
    return _read(name)


def __dir__() -> list[str]:
    return sorted(__all__)
