"""Distributed PyTorch on flow nodes: ``PyTorchDistributor`` and ``get_context()``.

    from flow_sdk.data import ShardedDataConnector
    from flow_sdk.trainers.pytorch import (PyTorchDistributor, PyTorchScalingConfig,
                                           WorkerResourceConfig, get_context)

    def train_func():
        import torch.distributed as dist
        context = get_context()
        dist.init_process_group("gloo")           # RANK, WORLD_SIZE, MASTER_ADDR... are set
        shard = context.get_dataset_map()["train"].get_shard()   # this worker's rows
        ...
        if context.get_rank() == 0:
            torch.save(model.state_dict(), os.path.join(context.get_model_dir(), "model.pt"))

    distributor = PyTorchDistributor(train_func, scaling_config=PyTorchScalingConfig(
        num_nodes=2, num_workers_per_node=4,
        resource_requirements_per_worker=WorkerResourceConfig(num_cpus=8, num_gpus=1)))
    response = distributor.run(dataset_map={"train": ShardedDataConnector.from_parquet(...)},
                               hyper_params={"lr": 1e-3})
    response.get_model_dir()                      # where rank 0 saved model.pt

Inside a ``run_on="head"`` job (see ``flow_sdk.node.headjob``), ``run`` uses the job's own workers
(all of them when no scaling config is given) instead of launching a task. Elsewhere:
``run`` launches one task of ``num_nodes`` nodes with ``num_workers_per_node``
workers each (``distributed_mode="auto"``: the torch.distributed variables are set; with
``num_gpus=1`` every worker has its own GPU). Each worker sets up its context and calls
``train_func()``; the task's result is every worker's return value.

The model directory is ``<artifact_location>/model/<task id>``. ``artifact_location`` must be
a directory every node can write: any local path for the local provider, a file volume's
mount path (with ``function_options={"volumes": ...}``) elsewhere. Without it the directory
is on the file volume ``flow-trainer-artifacts`` mounted at ``/flow-artifacts`` on every node,
and ``get_model_dir()`` on the response is that volume's directory on this machine (local
provider) or the path on the nodes (other providers). Workers see the directory through
``flow_sdk.current.path``, so it works with literal and mapped volume paths alike.

This module imports neither torch nor xgboost: ``train_func`` brings its own imports.
"""

from __future__ import annotations

import os
import posixpath
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flow_sdk.node import current, headjob
from flow_sdk.client.app import FlowApp, RemoteFunction
from flow_sdk.trainers._common import (
    DEFAULT_GPU_TYPE,
    as_sharded,
    declare,
    launch_options,
    node_path,
    problem,
    wait_for_results,
)
from flow_sdk.trainers._pytorch_scaling import PyTorchScalingConfig, WorkerResourceConfig
from flow_sdk.trainers._pytorch_worker import (
    RunJob,
    TrainingContext,
    _pytorch_run,
    get_context,
)
from flow_sdk.volumes import Volume

if TYPE_CHECKING:
    from flow_sdk.data import DataConnector, ShardedDataConnector
    from flow_sdk.client.task import Task

__all__ = [
    "PyTorchDistributor",
    "PyTorchRunResponse",
    "PyTorchScalingConfig",
    "TrainingContext",
    "WorkerResourceConfig",
    "get_context",
]

ARTIFACT_VOLUME = "flow-trainer-artifacts"
ARTIFACT_MOUNT = "/flow-artifacts"


@dataclass(frozen=True)
class PyTorchRunResponse:
    """What ``PyTorchDistributor.run`` returns."""

    task_id: str
    model_dir: str
    results: list[Any]
    task: Task | None = field(repr=False, compare=False)  # None: ran inside a head job

    def get_model_dir(self) -> str:
        """The run's model directory, as this machine opens it (see the module docstring
        for non-local providers)."""
        return self.model_dir

    @property
    def result(self) -> Any:
        """Rank 0's return value of ``train_func``."""
        return self.results[0] if self.results else None


class PyTorchDistributor:
    """Run ``train_func`` (no arguments; it calls ``get_context()``) on every worker of a
    multi-node task, ``torch.distributed`` environment set.

    ``provider``/``provider_config`` pick where the nodes run (default: local processes);
    ``gpu_type`` is the GPU model of the workers when ``num_gpus=1``. ``function_options``
    are further ``@app.function`` options (``volumes``, ``environment``,
    ``max_run_time_hours``, ...); those the scaling config sets (``num_instances``,
    ``workers_per_node``, ``gpu``, ``distributed_mode``) are refused. ``timeout_s`` bounds
    the wait in ``run`` (the task is cancelled when it passes). Bad options raise
    ``flow_sdk.ValidationError`` naming the field here, and nothing is launched.
    """

    def __init__(self, train_func: Callable[[], Any],
                 scaling_config: PyTorchScalingConfig | None = None, *,
                 provider: str = "local", provider_config: dict[str, Any] | None = None,
                 gpu_type: str = DEFAULT_GPU_TYPE,
                 function_options: Mapping[str, Any] | None = None,
                 timeout_s: float | None = None) -> None:
        if not callable(train_func):
            raise problem("train_func", f"must be a function, got {type(train_func).__name__}")
        self._whole_job = scaling_config is None  # inside a head job: all of its workers
        if scaling_config is None:
            scaling_config = PyTorchScalingConfig()
        if not isinstance(scaling_config, PyTorchScalingConfig):
            raise problem("scaling_config", "must be a PyTorchScalingConfig, got "
                                            f"{type(scaling_config).__name__}")
        if timeout_s is not None and not timeout_s > 0:
            raise problem("timeout_s", f"must be a positive number of seconds, got {timeout_s!r}")
        self.train_func = train_func
        self.scaling_config = scaling_config
        self.timeout_s = timeout_s
        self.provider = provider
        self.provider_config = provider_config
        self._options = launch_options(scaling_config.task_options(gpu_type), function_options)
        self._app = FlowApp("pytorch", provider=provider, provider_config=provider_config)
        # Declared now so bad options fail here; ``run`` adds the artifact volume if needed.
        self._remote: RemoteFunction[[RunJob], Any] = declare(self._app, _pytorch_run,
                                                                self._options)

    def __repr__(self) -> str:
        return (f"PyTorchDistributor({getattr(self.train_func, '__name__', 'train_func')}, "
                f"scaling_config={self.scaling_config!r}, provider={self.provider!r})")

    def _artifact_volume(self) -> Volume:
        return Volume(ARTIFACT_VOLUME, interface="file", provider=self.provider,
                      provider_config=self.provider_config)

    def run(self, dataset_map: Mapping[str, DataConnector | Any] | None = None,
            hyper_params: Mapping[str, Any] | None = None,
            artifact_location: str | os.PathLike[str] | None = None, *,
            artifact_stage_location: str | os.PathLike[str] | None = None
            ) -> PyTorchRunResponse:
        """Launch the run, wait for it, and return its response.

        ``dataset_map`` maps names to ``DataConnector`` s (each becomes a
        ``ShardedDataConnector``: ``get_shard()`` inside ``train_func`` is that worker's
        part); ``hyper_params`` is any picklable mapping; ``artifact_location`` is the
        directory the model directory goes under (see the module docstring);
        ``artifact_stage_location`` is Snowflake's name for it (a directory here: stages do
        not exist). A failed worker re-raises its exception here with the remote traceback.
        """
        if artifact_stage_location is not None:
            artifact_location = _stage_as_directory(artifact_stage_location, artifact_location)
        if dataset_map is not None and not isinstance(dataset_map, Mapping):
            raise problem("dataset_map", "must be a dict of name -> DataConnector, got "
                                         f"{type(dataset_map).__name__}")
        if hyper_params is not None and not isinstance(hyper_params, Mapping):
            raise problem("hyper_params", "must be a dict, got "
                                          f"{type(hyper_params).__name__}")
        datasets = {str(name): as_sharded(data, f"dataset_map[{name!r}]")
                    for name, data in (dataset_map or {}).items()}
        pool = headjob.active()
        if pool:  # inside a run_on="head" job: on the job's own workers
            return self._run_in_job(pool, datasets, dict(hyper_params or {}), artifact_location)
        remote = self._remote
        volume: Volume | None = None
        if artifact_location is None:
            volume = self._artifact_volume()
            volumes = dict(self._options.get("volumes") or {})
            if ARTIFACT_MOUNT in volumes:
                raise problem(f"function_options.volumes[{ARTIFACT_MOUNT!r}]",
                              "is where the default artifact volume goes; pass "
                              "artifact_location or mount your volume elsewhere")
            volumes[ARTIFACT_MOUNT] = volume
            remote = self._remote.with_options(volumes=volumes)
            root = ARTIFACT_MOUNT
        else:
            root = node_path(artifact_location, self._app.provider().shares_client_filesystem,
                             "artifact_location")
        job = RunJob(self.train_func, datasets, dict(hyper_params or {}), root)
        task = remote.spawn(job)
        results = wait_for_results(task, self.timeout_s)
        model_dir = posixpath.join(root, "model", task.task_id)
        volumes = self._app.provider().volumes
        local = volumes.local_path(volume.name) if volume is not None else None
        if local is not None:
            model_dir = os.fspath(local / "model" / task.task_id)
        return PyTorchRunResponse(task.task_id, model_dir, results, task)

    def _run_in_job(self, pool: headjob.HeadPool, datasets: dict[str, ShardedDataConnector],
                    hyper_params: dict[str, Any],
                    artifact_location: str | os.PathLike[str] | None) -> PyTorchRunResponse:
        """Run on the workers of the job this process heads. The model directory is under
        ``artifact_location`` (default: ``flow-artifacts`` in the head's working directory);
        rank 0, the head, writes to its own node's disk there."""
        config = self.scaling_config
        if not self._whole_job:
            for field_name, wanted, has in (
                    ("num_nodes", config.num_nodes, pool.num_nodes),
                    ("num_workers_per_node", config.num_workers_per_node,
                     pool.workers_per_node)):
                if wanted > has:
                    raise problem(f"scaling_config.{field_name}",
                                  f"asks for {wanted} but this job has {has}; leave "
                                  "scaling_config out to use the whole job")
        ranks = (pool.ranks() if self._whole_job
                 else pool.ranks(config.num_nodes, config.num_workers_per_node))
        root = os.path.abspath(os.fspath(artifact_location or "flow-artifacts"))
        task_id = str(current.task_id or "no-task")
        run_name = f"{task_id}-{secrets.token_hex(3)}"
        job = RunJob(self.train_func, datasets, hyper_params, root, run_name)
        results = pool.run(_pytorch_run, (job,), ranks)
        return PyTorchRunResponse(task_id, posixpath.join(root, "model", run_name), results,
                                  None)


def _stage_as_directory(stage: str | os.PathLike[str],
                        artifact_location: str | os.PathLike[str] | None) -> str:
    """Snowflake's ``artifact_stage_location`` as ``artifact_location``: a directory path is
    accepted; a stage name is refused with what to use instead."""
    text = os.fspath(stage)
    if artifact_location is not None:
        raise problem("artifact_stage_location", "give artifact_location or "
                                                 "artifact_stage_location, not both")
    if text.startswith("@") or ("/" not in text and "." in text):
        raise problem("artifact_stage_location",
                      f"{text!r} names a Snowflake stage, which does not exist here; pass a "
                      "directory every node can write (a file volume's mount path, or any "
                      "local path with the local provider) as artifact_location")
    return text
