"""The client's copy of each task's secret: a 0600 file per task under ``$FLOW_HOME/secrets``.

The secret never enters a store (``flow_sdk.wire.signing``); keeping it here lets
``Task.from_id`` and ``flow gc`` in another process of the same user check what they read.
Beside it, how this machine's launch of the task ended (``launched`` or ``rolled-back``): a
store writer can put back an older sealed "launching" lease, but cannot touch this file, so
``flow_sdk.lifecycle`` never takes a replayed lease for a launch cut short.
"""

from __future__ import annotations

import os
from pathlib import Path

from flow_sdk._config import flow_home
from flow_sdk.errors import TaskSecretError
from flow_sdk.wire.signing import secret_from_hex


def _secret_path(task_id: str) -> Path:
    return flow_home() / "secrets" / f"{task_id}.key"


def save_task_secret(task_id: str, secret_hex: str) -> None:
    """Keep the task's secret on this machine (0600 file in a 0700 folder), never in a store."""
    path = _secret_path(task_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret_hex)


def _launch_end_path(task_id: str) -> Path:
    return flow_home() / "secrets" / f"{task_id}.launch"


def save_launch_end(task_id: str, state: str) -> None:
    """Remember on this machine how its launch of ``task_id`` ended (``launched`` or
    ``rolled-back``), beside the task's secret."""
    path = _launch_end_path(task_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(state)


def launch_end(task_id: str) -> str | None:
    """How this machine's launch of ``task_id`` ended, or None while it has not said (the
    launch still runs, or its client was killed mid-launch)."""
    path = _launch_end_path(task_id)
    return path.read_text().strip() if path.is_file() else None


def has_task_secret(task_id: str) -> bool:
    return _secret_path(task_id).is_file()


def task_secret_ids() -> list[str]:
    """Every task whose secret this machine holds (the tasks launched here), sorted."""
    folder = flow_home(create=False) / "secrets"
    return sorted(p.stem for p in folder.glob("*.key")) if folder.is_dir() else []


def load_task_secret(task_id: str) -> bytes:
    """The secret that the client which launched ``task_id`` on this machine saved."""
    path = _secret_path(task_id)
    if not path.is_file():
        raise TaskSecretError(f"no secret for task {task_id!r} at {path}: only the machine "
                              "(and user) that launched a task can read its results")
    return secret_from_hex(path.read_text().strip())


def remove_task_secret(task_id: str) -> None:
    """Forget a secret (a pool's, once the pool is down), and how its launch ended."""
    _secret_path(task_id).unlink(missing_ok=True)
    _launch_end_path(task_id).unlink(missing_ok=True)
