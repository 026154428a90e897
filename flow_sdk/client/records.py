"""What this machine remembers of the tasks it launched: one JSON file per task under
``$FLOW_HOME/tasks/`` naming the provider (and its config) that holds it, so ``Task.from_id``,
``flow list`` and ``flow gc`` work from any process of the same user."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from flow_sdk._config import flow_home
from flow_sdk.errors import TaskNotFoundError
from flow_sdk.providers.base import Provider


def _path(task_id: str) -> Path:
    return flow_home() / "tasks" / f"{task_id}.json"


def save_client_record(task_id: str, provider: Provider, extra: dict[str, Any]) -> None:
    """Remember which provider holds a task so ``Task.from_id`` works from any process."""
    path = _path(task_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"task_id": task_id, "provider": provider.name, "provider_config": provider.config(),
            **extra}
    path.write_text(json.dumps(data, sort_keys=True))


def load_client_record(task_id: str) -> dict[str, Any]:
    """The record of a task this machine launched; ``TaskNotFoundError`` when there is none."""
    path = _path(task_id)
    if not path.exists():
        raise TaskNotFoundError(f"no task {task_id!r} in {path.parent}; `flow list` shows "
                                "the tasks this machine knows")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def note_last_seen(task_id: str, seen: dict[str, Any]) -> None:
    """Remember, in the task's record, what this machine last saw of it once it ended (its
    status, and what ``flow list`` showed), so the task keeps a status after its provider
    can no longer answer for it (a simulated account that stopped, records past their
    expiry). A task this machine has no record of is left alone."""
    path = _path(task_id)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return
    merged = {**(data.get("last_seen") or {}), **seen}
    if data.get("last_seen") == merged:
        return
    data["last_seen"] = merged
    temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    temp.write_text(json.dumps(data, sort_keys=True))
    os.replace(temp, path)  # whole: a reader never sees half a record


def list_client_records() -> list[dict[str, Any]]:
    """Every task this machine launched, by task id."""
    folder = flow_home() / "tasks"
    if not folder.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
