"""The worker side of a ``PyTorchDistributor`` run: the task's function sets up this worker's
``TrainingContext`` (read with ``get_context()``) and calls ``train_func``."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flow_sdk.node import current
from flow_sdk.trainers._common import Place, TrainerError

if TYPE_CHECKING:
    from flow_sdk.data import ShardedDataConnector

__all__ = ["RunJob", "TrainingContext", "get_context"]


class TrainingContext:
    """What ``get_context()`` returns inside ``train_func``: this worker's place in the run,
    its data and hyper-parameters, and where to save the model."""

    def __init__(self, place: Place, dataset_map: Mapping[str, ShardedDataConnector],
                 hyper_params: Mapping[str, Any], model_dir: str) -> None:
        self._place = place
        self._dataset_map = dict(dataset_map)
        self._hyper_params = dict(hyper_params)
        self._model_dir = model_dir

    def __repr__(self) -> str:
        return (f"TrainingContext(rank={self.get_rank()}, world_size={self.get_world_size()}, "
                f"model_dir={self._model_dir!r})")

    def get_rank(self) -> int:
        """This worker's rank among all workers (``RANK``)."""
        return self._place.rank

    def get_local_rank(self) -> int:
        """This worker's rank on its node (``LOCAL_RANK``); its GPU index with GPUs."""
        return self._place.local_rank

    def get_world_size(self) -> int:
        """Workers in all (``WORLD_SIZE``)."""
        return self._place.world_size

    def get_local_world_size(self) -> int:
        """Workers on this node (``LOCAL_WORLD_SIZE``)."""
        return self._place.local_world_size

    def get_node_rank(self) -> int:
        """This worker's node index (``NODE_RANK``)."""
        return self._place.node_rank

    def get_num_nodes(self) -> int:
        """Nodes in all."""
        return self._place.num_nodes

    def get_dataset_map(self) -> dict[str, ShardedDataConnector]:
        """The run's ``dataset_map``: ``value.get_shard()`` is this worker's disjoint shard
        (by ``RANK`` and ``WORLD_SIZE``); the value itself reads every row."""
        return dict(self._dataset_map)

    def get_hyper_params(self) -> dict[str, Any]:
        """The run's ``hyper_params`` (a copy)."""
        return dict(self._hyper_params)

    def get_model_dir(self) -> str:
        """The run's model directory as this worker opens it (it exists); rank 0's files
        there are what ``PyTorchRunResponse.get_model_dir()`` shows the caller."""
        return self._model_dir


_context: TrainingContext | None = None


def get_context() -> TrainingContext:
    """The context of the ``train_func`` running in this process under
    ``PyTorchDistributor.run``; ``TrainerError`` anywhere else."""
    if _context is None:
        raise TrainerError("get_context() works only inside a train_func run by "
                           "PyTorchDistributor.run()")
    return _context


@dataclass(frozen=True)
class RunJob:
    """Everything a worker needs, pickled into the task's payload."""

    train_func: Callable[[], Any]
    dataset_map: dict[str, ShardedDataConnector]
    hyper_params: dict[str, Any]
    artifact_root: str  # on the nodes; current.path() resolves a volume mount path
    run_name: str | None = None  # the model folder's name (default: the task id)


def _model_dir_on_node(artifact_root: str, name: str | None) -> str:
    path = current.path(posixpath.join(artifact_root, "model", name or "no-task"), write=True)
    os.makedirs(path, exist_ok=True)
    return path


def _pytorch_run(job: RunJob) -> Any:
    """The task's function: every worker sets its context, then runs ``train_func()``.

    Its name is the task function's name that listings show, so it keeps it."""
    global _context
    place = Place.here()
    _context = TrainingContext(place, job.dataset_map, job.hyper_params,
                               _model_dir_on_node(job.artifact_root,
                                                  job.run_name or place.task_id))
    try:
        return job.train_func()
    finally:
        _context = None
