"""What this machine remembers of the pools it made: one JSON file per pool under
``$FLOW_HOME/pools/`` (name, pool id, provider and its config, and the process that ran
``pool up`` while it runs), so ``flow pool list``, a later ``@app.function(pool=...)`` and
``flow gc`` find them from any process of the same user. The pool's secret is kept beside the
task secrets (``flow_sdk.home.tasksecrets``, under the pool's id)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flow_sdk.system import procs
from flow_sdk._config import flow_home


@dataclass(frozen=True)
class PoolFile:
    name: str
    pool_id: str
    provider: str
    provider_config: dict[str, Any]
    created_at: float
    launcher_pid: int  # the process that ran ``pool up``; 0 once it finished
    launcher_ticks: int | None

    @property
    def launching(self) -> bool:
        """Whether the ``pool up`` that made it still runs."""
        return bool(self.launcher_pid) and procs.is_alive(self.launcher_pid,
                                                          self.launcher_ticks)


def _path(name: str) -> Path:
    return flow_home() / "pools" / f"{name}.json"


def save_pool_file(pool: PoolFile) -> None:
    path = _path(pool.name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    temp.write_text(json.dumps(asdict(pool), sort_keys=True))
    os.replace(temp, path)


def launching_here(name: str, pool_id: str, provider: str, config: dict[str, Any],
                   created_at: float) -> PoolFile:
    """The file of a pool this process is making now."""
    return PoolFile(name, pool_id, provider, config, created_at, os.getpid(),
                    procs.start_ticks(os.getpid()))


def load_pool_file(name: str) -> PoolFile | None:
    path = _path(name)
    if not path.is_file():
        return None
    return PoolFile(**json.loads(path.read_text()))


def list_pool_files() -> list[PoolFile]:
    folder = flow_home(create=False) / "pools"
    if not folder.is_dir():
        return []
    return [PoolFile(**json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]


def remove_pool_file(name: str, pool_id: str) -> None:
    """Forget the pool ``name`` when the file still names ``pool_id`` (not a newer one)."""
    found = load_pool_file(name)
    if found is not None and found.pool_id == pool_id:
        _path(name).unlink(missing_ok=True)
