"""The scenario's tasks as the harness sees them: found in the store (not only through what
the caller said), their records, and handles to read their state past the fault proxy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _chaos_account import Account
from flow_sdk import Task
from flow_sdk.providers import get_provider
from flow_sdk.providers.base import Provider


def sim_task_keys(account: Account) -> dict[str, tuple[str, str]]:
    """task id -> (bucket, key of its record) for every task record in the account."""
    s3 = account.client("s3")
    found = {}
    for bucket in s3.list_buckets().get("Buckets", []):
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket["Name"])
        for page in pages:
            for obj in page.get("Contents", []):
                key = obj["Key"]
                if key.endswith("/task.json") and "/tasks/" in f"/{key}":
                    task_id = key.rsplit("/", 2)[-2]
                    found[task_id] = (bucket["Name"], key)
    return found


class TaskFinder:
    """The scenario's task ids and its store's record of each."""

    def __init__(self, home: Path, account: Account | None, known: set[str]) -> None:
        self.home, self.account, self.known = home, account, known  # known: earlier scenarios'


    def task_ids(self) -> list[str]:
        ids = {p.stem for p in (self.home / "tasks").glob("*.json")}
        ids |= {p.name for p in (self.home / "local" / "store" / "tasks").glob("*")
                if p.is_dir() and not p.name.startswith("pool")}
        ids |= {p.name for p in (self.home / "sim-root" / "nodes").glob("*") if p.is_dir()}
        ids |= {p.name for p in (self.home / "slurm-shared" / "jobs").glob("*") if p.is_dir()}
        if self.account is not None:
            ids |= set(sim_task_keys(self.account)) - self.known
        return sorted(i for i in ids if i not in self.known)

    def rdzv_port(self) -> int | None:
        """The store's port of the scenario's task, once its record exists."""
        for store in ("local/store", "slurm-shared/store"):
            for path in (self.home / store / "tasks").glob("*/task.json"):
                return _port(path.read_bytes())
        if self.account is None:
            return None
        for task_id, (bucket, key) in sim_task_keys(self.account).items():
            if task_id not in self.known:
                s3 = self.account.client("s3")
                return _port(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        return None


def _port(raw: bytes) -> int | None:
    try:
        return int(json.loads(raw)["rdzv_port"])
    except (ValueError, KeyError, TypeError):
        return None  # being written: the next look reads it


def direct_provider(name: str, config: dict[str, Any], account: Account | None) -> Provider:
    """The scenario's provider, reaching the simulated account directly (no injected faults)."""
    if account is not None and name == "aws-sim":
        config = {**config, **account.provider_config(account.url)}
    return get_provider(name, config)


def handle(task_id: str, provider: Provider) -> Task:
    return Task(task_id, provider)
