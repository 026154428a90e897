"""The layout of a ``PyTorchDistributor`` run: nodes, workers per node, and what each worker
gets; checked field by field when made, and turned into ``@app.function`` options."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flow_sdk.spec import MAX_GPUS_PER_NODE, MAX_INSTANCES, MAX_WORKERS_PER_NODE
from flow_sdk.trainers._common import DEFAULT_GPU_TYPE, check_int, problem

__all__ = ["PyTorchScalingConfig", "WorkerResourceConfig"]


@dataclass(frozen=True)
class WorkerResourceConfig:
    """What one worker gets: ``num_cpus`` threads (``OMP_NUM_THREADS``; 0 leaves the node's
    default, its cores split evenly between its workers) and ``num_gpus`` GPUs (0 for CPU;
    1 per worker for the usual one-process-per-GPU DDP; more, e.g. 4 with
    ``num_workers_per_node=1``, gives one worker all of its node's GPUs)."""

    num_cpus: int = 0
    num_gpus: int = 0

    def __post_init__(self) -> None:
        check_int(self.num_cpus, "scaling_config.resource_requirements_per_worker.num_cpus",
                  minimum=0)
        check_int(self.num_gpus, "scaling_config.resource_requirements_per_worker.num_gpus",
                  minimum=0, maximum=MAX_GPUS_PER_NODE)


@dataclass(frozen=True)
class PyTorchScalingConfig:
    """``num_nodes`` nodes with ``num_workers_per_node`` workers each, every worker with
    ``resource_requirements_per_worker``. Invalid values raise ``flow_sdk.ValidationError``
    naming the field, here, before anything is launched."""

    num_nodes: int = 1
    num_workers_per_node: int = 1
    resource_requirements_per_worker: WorkerResourceConfig = field(
        default_factory=WorkerResourceConfig)

    def __post_init__(self) -> None:
        check_int(self.num_nodes, "scaling_config.num_nodes", minimum=1, maximum=MAX_INSTANCES)
        check_int(self.num_workers_per_node, "scaling_config.num_workers_per_node", minimum=1,
                  maximum=MAX_WORKERS_PER_NODE)
        resources = self.resource_requirements_per_worker
        if not isinstance(resources, WorkerResourceConfig):
            raise problem("scaling_config.resource_requirements_per_worker",
                          f"must be a WorkerResourceConfig, got {type(resources).__name__}")
        gpus = resources.num_gpus * self.num_workers_per_node
        if gpus > MAX_GPUS_PER_NODE:
            raise problem("scaling_config.num_workers_per_node",
                          f"{self.num_workers_per_node} workers x {resources.num_gpus} GPUs is "
                          f"{gpus} GPUs per node, above the {MAX_GPUS_PER_NODE} a node has")

    @property
    def world_size(self) -> int:
        """Workers in all."""
        return self.num_nodes * self.num_workers_per_node

    def task_options(self, gpu_type: str = DEFAULT_GPU_TYPE) -> dict[str, Any]:
        """The ``@app.function`` options of a task with this layout; with GPUs each node
        gets ``num_workers_per_node * num_gpus`` of ``gpu_type``."""
        resources = self.resource_requirements_per_worker
        options: dict[str, Any] = {
            "num_instances": self.num_nodes,
            "workers_per_node": self.num_workers_per_node,
            "distributed_mode": "auto",
            "gpu": (f"{gpu_type}:{self.num_workers_per_node * resources.num_gpus}"
                    if resources.num_gpus else None),
        }
        if resources.num_cpus:
            options["environment"] = {"OMP_NUM_THREADS": str(resources.num_cpus)}
        return options
