"""Volumes and S3 mounts: the same files at the same path on every node of a task.

    @app.function(num_instances=2,
                  volumes={"/shared/ckpt": {"name": "ckpt", "size_gb": 500, "interface": "file"}},
                  mounts={"/data": "s3://bucket/prefix"})
    def train():
        open("/shared/ckpt/x", "w")          # read-write on every node; outlives the task
        open("/data/train.parquet", "rb")    # read-only on every node

Volumes (named, persistent until ``flow volumes delete``):

* ``interface="file"``: shared by every node. ``local``: a directory under the flow data dir
  (``$FLOW_HOME/local/volumes/<name>/data``). ``aws``: an EFS file system, mounted over NFS
  by the node's bootstrap before the agent starts.
* ``interface="block"``: one node only (``num_instances > 1`` is rejected when the function
  is declared). ``local``: a directory, held by one node at a time. ``aws``: an EBS volume.

The storage itself comes from the provider (``Provider.volumes``); this package is the same
for every provider.

S3 mounts (read-only): each node materializes the prefix once into a task-scoped cache (one
listing, objects streamed to disk in chunks, nothing downloaded twice for the task; local
nodes of one task share one cache), see ``s3mount``.

How local nodes see the paths
-----------------------------
Local nodes are processes on this machine, so ``/shared/ckpt`` cannot simply be created: that
would change the user's root file system, and two tasks could not use the same path for
different volumes. The node agent therefore tries, in this order (``FLOW_VOLUME_MODE`` =
``auto``, the default):

1. **Literal paths** (``namespace``): when the agent may create a private mount namespace
   (Linux with ``CAP_SYS_ADMIN``: root, a privileged container, a cloud node), its workers
   run in a private root that shows the host's whole file system plus each mount at its
   literal path (``namespace``). Nothing changes on the host and the mounts vanish with the
   node. S3 mounts are read-only bind mounts: every write fails in the kernel with
   ``OSError: [Errno 30] Read-only file system: '/data/...'``, for root too. ``auto`` picks this
   only when it hides nothing of the host: a mount path such as ``/tmp/x`` would make the rest
   of ``/tmp`` read-only in the task, and one over the node's own files (its working or flow
   data directory, Python) would break it, so ``auto`` maps such paths instead (``namespace``
   forces the first case and refuses the second). Dedicated paths such as ``/shared/ckpt`` or
   ``/data`` are literal. Local nodes read ``FLOW_VOLUME_MODE`` from the environment they
   inherit from the launching process.
2. **Mapped paths** (``mapped``, or where 1 is impossible: a non-root user, a default Docker
   container, macOS): the mount path does not exist; each worker gets ``FLOW_MOUNTS``, a JSON
   map from mount path to ``{"path": <directory used for it>, "read_only": ..., "source": ...}``,
   and ``flow_sdk.current.path("/shared/ckpt/x")`` returns the directory to use. Code that
   opens the literal path there fails with ``FileNotFoundError`` naming that path (the agent's
   log says paths are mapped). S3 caches are made read-only with mode bits: writes fail with
   ``PermissionError`` for non-root users, but root ignores mode bits, so there
   ``current.path(p, write=True)`` (and ``save_checkpoint``) is the check that refuses a write
   with ``ReadOnlyMountError``; a root process that writes to the mapped cache directly
   changes only its task's cache, never S3.

``current.path`` returns the literal path wherever it is real (mode 1 and cloud nodes), so
code written with it runs unchanged in both modes; code that uses literal paths needs mode 1.

This package is what the caller and user code use: ``Volume`` objects and ``list_volumes``/
``create_volume``/``delete_volume`` (what ``flow volumes`` calls), the volume errors, the mount
table behind ``current.path`` (``paths``) and the checkpoint helpers (``save_checkpoint``,
``latest_checkpoint``, ``load_checkpoint``, ...), which work in a task and outside one. The node
half, what a node's agent does with a task's volumes and mounts before its workers start
(preparation, S3 mount caches), is ``flow_sdk.node.volumes``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flow_sdk import _lazy

if TYPE_CHECKING:  # at run time each name is imported on first use (``_lazy``)
    from flow_sdk.volumes.api import (
        Volume,
        VolumeInfo,
        create_volume,
        delete_volume,
        list_volumes,
        volume_spec,
    )
    from flow_sdk.volumes.checkpoint import (
        checkpoint_step,
        latest_checkpoint,
        list_checkpoints,
        load_checkpoint,
        save_checkpoint,
    )
    from flow_sdk.volumes.errors import ReadOnlyMountError, VolumeError, VolumeInUseError

_WHERE: dict[str, str] = {
    "Volume": "flow_sdk.volumes.api",
    "VolumeInfo": "flow_sdk.volumes.api",
    "create_volume": "flow_sdk.volumes.api",
    "delete_volume": "flow_sdk.volumes.api",
    "list_volumes": "flow_sdk.volumes.api",
    "volume_spec": "flow_sdk.volumes.api",
    "checkpoint_step": "flow_sdk.volumes.checkpoint",
    "latest_checkpoint": "flow_sdk.volumes.checkpoint",
    "list_checkpoints": "flow_sdk.volumes.checkpoint",
    "load_checkpoint": "flow_sdk.volumes.checkpoint",
    "save_checkpoint": "flow_sdk.volumes.checkpoint",
    "ReadOnlyMountError": "flow_sdk.volumes.errors",
    "VolumeError": "flow_sdk.volumes.errors",
    "VolumeInUseError": "flow_sdk.volumes.errors",
}
__getattr__, __dir__ = _lazy.exports(__name__, globals(), _WHERE)

__all__ = [
    "ReadOnlyMountError", "Volume", "VolumeError", "VolumeInUseError",
    "VolumeInfo", "checkpoint_step", "create_volume", "delete_volume", "latest_checkpoint",
    "list_checkpoints", "list_volumes", "load_checkpoint", "save_checkpoint", "volume_spec",
]
