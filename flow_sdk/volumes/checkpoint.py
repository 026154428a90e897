"""Checkpoints on a shared volume, the documented pattern: rank 0 writes, every rank waits.

    from flow_sdk.volumes import latest_checkpoint, load_checkpoint, save_checkpoint

    state = load_checkpoint("/shared/ckpt/run-1")          # None on the first start
    start = state["epoch"] + 1 if state else 0
    for epoch in range(start, epochs):
        ...
        save_checkpoint({"epoch": epoch, "model": model.state_dict(),
                         "optim": opt.state_dict()}, "/shared/ckpt/run-1", step=epoch)

``save_checkpoint`` must be called on every rank: rank 0 writes ``ckpt-<step>.pt`` under a
temporary name, flushes it to disk and renames it into place (so a reader, or a resumed run
after a kill, sees a complete checkpoint or none), then every rank waits at
``torch.distributed.barrier()`` when a process group is initialized. Paths go through
``flow_sdk.current.path``, so mount paths work on every node (and a read-only S3 mount is
refused). torch is imported only when a checkpoint is written or read.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any

from flow_sdk.volumes.paths import path
from flow_sdk.wire import envvars

_NAME_RE = re.compile(r"^ckpt-(\d{8,})\.pt$")


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint of ``step``: ``ckpt-00000042.pt``."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
    return f"ckpt-{step:08d}.pt"


def checkpoint_step(path: str | os.PathLike[str]) -> int:
    """The step a checkpoint file was saved at."""
    match = _NAME_RE.match(Path(path).name)
    if match is None:
        raise ValueError(f"{path} is not a checkpoint file (ckpt-<step>.pt)")
    return int(match.group(1))


def _resolve(directory: str | os.PathLike[str], write: bool = False) -> Path:
    return Path(path(os.fspath(directory), write=write))


def _rank() -> int:
    """This worker's rank as the node agent set it (``flow_sdk._rank()``): ``RANK``, or
    the node's rank where a task sets none; 0 outside a task."""
    return int(os.environ.get("RANK") or os.environ.get(envvars.NODE_RANK) or 0)


def _process_group() -> Any | None:
    """``torch.distributed`` when a process group is initialized, else None."""
    import torch.distributed as dist
    return dist if dist.is_available() and dist.is_initialized() else None


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(obj: Any, directory: str | os.PathLike[str], step: int, *,
                    keep: int | None = None) -> Path:
    """Rank 0 saves ``obj`` (``torch.save``) as ``<directory>/ckpt-<step>.pt`` atomically;
    every rank then waits at a barrier. ``keep`` keeps only the newest ``keep`` checkpoints.
    Returns the checkpoint's path (on every rank)."""
    import torch

    if keep is not None and keep < 1:
        raise ValueError(f"keep must be at least 1 (got {keep}); None keeps every checkpoint")
    folder = _resolve(directory, write=True)
    target = folder / checkpoint_name(step)
    group = _process_group()
    rank = group.get_rank() if group is not None else _rank()
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        temp = folder / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            with open(temp, "wb") as handle:
                torch.save(obj, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        _fsync_dir(folder)
        if keep is not None:
            for old in list_checkpoints(folder)[:-keep]:
                old.unlink(missing_ok=True)
    if group is not None:
        group.barrier()
    return target


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Every complete checkpoint in ``directory``, oldest step first."""
    folder = _resolve(directory)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _NAME_RE.match(p.name)]
    return sorted(found, key=checkpoint_step)


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The checkpoint with the highest step in ``directory``, or None when there is none."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def load_checkpoint(path: str | os.PathLike[str], *, map_location: Any = "cpu",
                    weights_only: bool = True) -> Any:
    """Load a checkpoint file, or the latest checkpoint of a directory (None when it has
    none). ``weights_only`` is passed to ``torch.load`` (tensors, containers, numbers)."""
    import torch

    resolved = _resolve(path)
    if not resolved.is_file():
        if _NAME_RE.match(resolved.name):
            raise FileNotFoundError(f"no checkpoint file {resolved}")
        latest = latest_checkpoint(path)  # a directory: its latest, if any
        if latest is None:
            return None
        resolved = latest
    return torch.load(resolved, map_location=map_location, weights_only=weights_only)
