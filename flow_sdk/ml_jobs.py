"""Snowflake ML Jobs' names, mapped onto flow-sdk (docs/migration.md's Snowflake table).

    from flow_sdk.ml_jobs import submit_file, get_job

    job = submit_file("train.py", target_instances=3, args=["--epochs", "2"])
    job.id, job.status
    print(job.get_logs(instance_id=1))     # node 1's lines, one string
    job.result()                           # the script's ``__return__``

As in Snowflake, a submitted script runs on the head node only while the other nodes stay up
as the job's workers (``run_on="head"``): ``XGBEstimator`` and ``PyTorchDistributor`` called
in it train on the job's nodes. ``run_on="every_worker"`` runs it on every worker instead
(``flow run``'s default, torchrun's way). Other keyword arguments are ``@app.function``
options (``gpu=``, ``provider=``, ...). Snowflake's names that cannot mean the same here
(compute pools, stages, warehouses, sessions) raise ``ValidationError`` saying what to use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from flow_sdk.client.app import FlowApp
from flow_sdk.errors import FieldProblem, ValidationError
from flow_sdk.client.task import Task

__all__ = ["MLJob", "get_job", "submit_directory", "submit_file"]

APP_NAME = "ml-jobs"

# Snowflake arguments with no meaning here -> what to use instead.
_NO_MEANING_HERE = {
    "compute_pool": "nodes come from a provider, not a compute pool: pass gpu='h100:8' (or "
                    "none for CPU) and provider='aws' or 'local'",
    "stage_name": "the payload travels through the provider's object store, there is no "
                  "stage: leave stage_name out",
    "pip_requirements": "nodes run the caller's environment: install packages there (or in "
                        "image=...) and leave pip_requirements out",
    "external_access_integrations": "nodes reach the network their provider gives them: "
                                    "leave external_access_integrations out",
    "query_warehouse": "there is no warehouse: read data with flow_sdk.data.DataConnector",
    "database": "there is no database: read data with flow_sdk.data.DataConnector",
    "schema": "there is no schema: read data with flow_sdk.data.DataConnector",
    "session": "there is no session: leave it out",
    "spec_overrides": "pass @app.function options (gpu=, volumes=, ...) as keywords instead",
}


class MLJob(Task):
    """A task under Snowflake's job names: ``id``, ``get_logs(instance_id=...)``; every
    ``Task`` method (``status``, ``result()``, ``wait()``, ``cancel()``, ...) works too."""

    @property
    def id(self) -> str:
        """The task id (``Task.task_id``)."""
        return self.task_id

    def get_logs(self, limit: int = -1, instance_id: int | None = None) -> str:
        """The job's log as one string: node ``instance_id`` only (0 is the head), or every
        node; the last ``limit`` lines (-1: all). Same lines as ``Task.logs``."""
        lines = self.logs(node=instance_id, tail=None if limit < 0 else limit)
        return "\n".join(lines)

    def show_logs(self, limit: int = -1, instance_id: int | None = None) -> None:
        """Print :meth:`get_logs`."""
        print(self.get_logs(limit, instance_id))


def _options(target_instances: int, min_instances: int | None,
             env_vars: Mapping[str, str] | None, run_on: str,
             snowflake_only: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    problems = [FieldProblem(name, message) for name, message in _NO_MEANING_HERE.items()
                if snowflake_only.get(name) is not None]
    if problems:
        raise ValidationError(problems)
    merged: dict[str, Any] = {"num_instances": target_instances, "run_on": run_on, **options}
    if min_instances is not None:
        merged["min_instances"] = min_instances
    if env_vars:
        merged["environment"] = {**dict(env_vars), **dict(options.get("environment") or {})}
    return merged


def submit_file(file_path: str | os.PathLike[str], compute_pool: str | None = None, *,
                args: Sequence[str] | None = None, target_instances: int = 1,
                min_instances: int | None = None, env_vars: Mapping[str, str] | None = None,
                run_on: str = "head", provider: str = "local",
                provider_config: dict[str, Any] | None = None, stage_name: str | None = None,
                **options: Any) -> MLJob:
    """Run a Python file as a job of ``target_instances`` nodes; see the module docstring.
    Snowflake-only arguments (``compute_pool``, ``stage_name``, ``pip_requirements``, ...)
    must be left out; each raises ``ValidationError`` saying what to use."""
    extra = {k: options.pop(k) for k in list(options) if k in _NO_MEANING_HERE}
    merged = _options(target_instances, min_instances, env_vars, run_on,
                      {"compute_pool": compute_pool, "stage_name": stage_name, **extra}, options)
    app = FlowApp(APP_NAME, provider=provider, provider_config=provider_config)
    task = app.submit_file(file_path, args=tuple(args or ()), **merged)
    return MLJob(task.task_id, task.provider)


def submit_directory(dir_path: str | os.PathLike[str], compute_pool: str | None = None, *,
                     entrypoint: str, args: Sequence[str] | None = None,
                     target_instances: int = 1, min_instances: int | None = None,
                     env_vars: Mapping[str, str] | None = None, run_on: str = "head",
                     provider: str = "local", provider_config: dict[str, Any] | None = None,
                     stage_name: str | None = None, **options: Any) -> MLJob:
    """Ship ``dir_path`` and run ``entrypoint`` (a path inside it, or from its parent as
    Snowflake writes it: ``project/main.py``) as a job; otherwise like :func:`submit_file`."""
    extra = {k: options.pop(k) for k in list(options) if k in _NO_MEANING_HERE}
    merged = _options(target_instances, min_instances, env_vars, run_on,
                      {"compute_pool": compute_pool, "stage_name": stage_name, **extra}, options)
    app = FlowApp(APP_NAME, provider=provider, provider_config=provider_config)
    task = app.submit_directory(dir_path, entrypoint=entrypoint, args=tuple(args or ()),
                                **merged)
    return MLJob(task.task_id, task.provider)


def get_job(job_id: str) -> MLJob:
    """The job (task) with this id, as this machine knows it (``flow list``)."""
    task = Task.from_id(job_id)
    return MLJob(task.task_id, task.provider)

