"""Where a worker finds a mount path: the table the node agent hands its workers in
``FLOW_MOUNTS`` (mount path -> the path used for it, read-only flag, source). ``node`` writes
the table (``prepare_volumes``), this module reads it; ``flow_sdk.current.path`` and the
checkpoint helpers are built on :func:`path`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypeVar

from flow_sdk.errors import ReadOnlyMountError
from flow_sdk.wire import envvars


PathT = TypeVar("PathT", str, Path)


def mount_table() -> dict[str, dict[str, Any]]:
    """Every mount of the task as ``prepare_volumes`` described it (empty outside a task)."""
    raw = os.environ.get(envvars.MOUNTS)
    return json.loads(raw) if raw else {}


def mounts() -> dict[str, str]:
    """Mount path -> the path this process uses for it."""
    return {mount: str(entry["path"]) for mount, entry in mount_table().items()}


def path(mount_path: PathT, *, write: bool = False) -> PathT:
    """Where this process finds ``mount_path`` (a volume or S3 mount path, or a path under
    one); any other path comes back unchanged, as does everything outside a task.

    ``write=True`` raises ``flow_sdk.volumes.ReadOnlyMountError`` for a read-only S3 mount.
    Returns a ``str`` for a ``str`` and a ``Path`` for a ``Path``.
    """
    text = os.fspath(mount_path)
    table = mount_table()
    for mount in sorted(table, key=len, reverse=True):
        if text == mount or text.startswith(mount + "/"):
            entry = table[mount]
            if write and entry.get("read_only"):
                raise ReadOnlyMountError(mount, str(entry.get("source", "S3")), text)
            real = str(entry["path"]) + text[len(mount):]
            return Path(real) if isinstance(mount_path, Path) else real
    return mount_path
