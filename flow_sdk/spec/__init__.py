"""The task description: every option of ``@app.function`` validated into a ``TaskSpec``.

ALL validation of user input happens here, when the decorator runs, before any provider call.
A rejected option raises :class:`flow_sdk.errors.ValidationError` naming the field and the fix.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any, Literal

import pydantic
from pydantic import Field, ValidationInfo, field_validator, model_validator

from flow_sdk.errors import FieldProblem, ValidationError
from flow_sdk.spec.parts import (
    ANY_GPU_MODEL,
    MAX_GPUS_PER_NODE,
    FrozenModel,
    GpuSpec,
    VolumeSpec,
    check_intranode,
    check_mount_path,
    check_s3_uri,
    volume_input,
)
from flow_sdk.wire import envvars

__all__ = ["ANY_GPU_MODEL", "MAX_GPUS_PER_NODE", "MAX_INSTANCES", "MAX_WORKERS_PER_NODE",
           "GpuSpec", "TaskSpec", "VolumeSpec", "build_task_spec", "check_mount_path"]

MAX_INSTANCES = 4096
MAX_WORKERS_PER_NODE = 256
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
POOL_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$|^[a-z]$")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0  # torch's NCCL default; gloo's own is 30 minutes
DEFAULT_IDLE_STOP_S = 1800.0  # a pool made without idle_stop stops after 30 idle minutes

# A worker's place in the gang: distributed_mode="auto" computes these (and FLOW_*, but for
# the user's settings), so an ``environment`` value would give workers one rank or a wrong leader.
GANG_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                  "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")

Priority = Literal["low", "med", "high"]
DistributedMode = Literal["auto", "manual"]
Interconnect = Literal["ethernet", "efa", "infiniband"]


class _FieldValueError(ValueError):
    """A check across fields that blames one of them (``build_task_spec`` names it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def gang_variables_in(environment: dict[str, str]) -> list[str]:
    """The names in ``environment`` that set a worker's place in the gang (sorted)."""
    return sorted(k for k in environment if k in GANG_VARIABLES
                  or (k.startswith(envvars.PREFIX) and k not in envvars.USER_SETTABLE))


def parse_duration(value: Any, what: str) -> float:
    """Seconds from ``"30m"``, ``"2h"``, ``"45s"``, ``"1d"`` or a number of seconds; raises
    ValueError naming ``what``."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a duration such as '20m', '2h' or '90s', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION_RE.match(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(f"{what} must be a duration such as '20m', '2h' or '90s', got "
                             f"{value!r}")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    if not math.isfinite(seconds) or seconds <= 0 or seconds > 30 * 86400:
        raise ValueError(f"{what} must be more than 0 and at most 30 days, got {value!r}")
    return seconds


def _finite_positive(value: float | None, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive number (got {value!r}); leave it unset for no cap")
    return float(value)


class TaskSpec(FrozenModel):
    """Everything needed to launch one task. Built by ``@app.function`` and stored with the task."""

    app: str
    name: str
    provider: str = "local"
    gpu: GpuSpec | None = None
    num_instances: int = Field(default=1, ge=1, le=MAX_INSTANCES)
    min_instances: int | None = None
    workers_per_node: int | None = None
    distributed_mode: DistributedMode = "auto"
    # "every_worker": the function (or script) runs on every worker (torchrun's way);
    # "head": on rank 0 only, the other workers serve its trainers (Snowflake's job model).
    run_on: Literal["every_worker", "head"] = "every_worker"
    environment: dict[str, str] = Field(default_factory=dict)
    image: str | None = None
    region: str | None = None
    volumes: dict[str, VolumeSpec] = Field(default_factory=dict)
    mounts: dict[str, str] = Field(default_factory=dict)
    max_price_per_hour: float | None = None
    max_run_time_hours: float | None = None
    priority: Priority = "med"
    internode_interconnect: Interconnect | None = None
    # The link between a node's GPUs (sxm5, pcie, ...), checked against the GPU catalog.
    intranode_interconnect: str | None = None
    # From launch until a node's agent is up (install, image pull, volumes); a node that is
    # not up by then powers off. 20 minutes fits a cold pip install plus a large image pull.
    boot_timeout_s: float = Field(default=1200.0, gt=0, le=24 * 3600)
    # From the first agent up until every node has joined (then the task fails, naming who
    # is missing, or proceeds with min_instances).
    availability_timeout_s: float = Field(default=300.0, gt=0, le=24 * 3600)
    max_restarts: int = Field(default=0, ge=0, le=100)
    # Which failures ``max_restarts`` restarts after: "infra" (a lost node, the OOM killer, a
    # full disk, a signal from outside) or "any" (a user exception too).
    restart_on: Literal["infra", "any"] = "infra"
    # A rank with no output and no ``current.step`` for this long is stalled: "auto" is the
    # larger of 2 minutes and 5 median step intervals, but at most half of
    # ``collective_timeout`` (so a rank that stops is named before its peers' collectives time
    # out); a duration below ``collective_timeout`` sets it, "off" disables.
    stall_timeout: float | Literal["auto", "off"] = "auto"
    on_stall: Literal["warn", "fail"] = "warn"
    # The default timeout of the workers' torch.distributed process groups: a collective that
    # a dead or frozen peer blocks fails after this long.
    collective_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    preflight: bool = False
    key_name: str | None = None
    # Modules shipped by value besides the caller's own files: installed packages the nodes
    # lack (an editable install of your own library), by importable dotted name.
    include: tuple[str, ...] = ()
    # A named pool of warm nodes to run on (made with this task's shape when it does not
    # exist): nodes that outlive the task, run the pool's tasks one after another and stop
    # after ``idle_stop`` seconds without one ("20m", "2h"). ``spares`` extra nodes stand by
    # to take a lost node's place without a boot.
    pool: str | None = None
    idle_stop: float | None = None
    spares: int = Field(default=0, ge=0, le=64)

    @field_validator("gpu", mode="before")
    @classmethod
    def _parse_gpu(cls, value: Any) -> Any:
        if value is None or isinstance(value, GpuSpec | dict):
            return value
        return GpuSpec.parse(value)

    @field_validator("include", mode="before")
    @classmethod
    def _module_names(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(f"include must be a list of module names, e.g. [{value!r}]")
        bad = [m for m in value if not isinstance(m, str) or not _MODULE_RE.match(m)]
        if bad:
            raise ValueError(f"{bad} are not module names; write dotted import names such as "
                             "'mylib' or 'mylib.utils'")
        return tuple(value)

    @field_validator("pool")
    @classmethod
    def _pool_name(cls, value: str | None) -> str | None:
        if value is not None and not POOL_NAME_RE.match(value):
            raise ValueError(f"pool name {value!r} must be 1-32 lowercase letters, digits and "
                             "'-', starting with a letter and not ending with '-', e.g. 'dev'")
        return value

    @field_validator("stall_timeout", mode="before")
    @classmethod
    def _stall_timeout(cls, value: Any) -> Any:
        if value in ("auto", "off"):
            return value
        return parse_duration(value, "stall_timeout (or 'auto', 'off')")

    @field_validator("collective_timeout", mode="before")
    @classmethod
    def _collective_timeout(cls, value: Any) -> Any:
        return parse_duration(value, "collective_timeout")

    @field_validator("idle_stop", mode="before")
    @classmethod
    def _idle_stop(cls, value: Any) -> Any:
        return None if value is None else parse_duration(value, "idle_stop")

    @field_validator("environment")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not _ENV_NAME_RE.match(k)]
        if bad:
            raise ValueError(f"environment variable names {bad} are not valid shell names "
                             "(letters, digits and '_', not starting with a digit)")
        return value

    @field_validator("volumes", mode="before")
    @classmethod
    def _volume_paths(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {check_mount_path(path): volume_input(spec) for path, spec in value.items()}
        return value

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, value: dict[str, str]) -> dict[str, str]:
        return {check_mount_path(path): check_s3_uri(uri) for path, uri in value.items()}

    @field_validator("internode_interconnect", mode="before")
    @classmethod
    def _interconnect_lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("intranode_interconnect")
    @classmethod
    def _intranode(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None or "gpu" not in info.data:  # a bad gpu is reported on its own
            return value
        return check_intranode(value, info.data["gpu"])

    @field_validator("max_price_per_hour")
    @classmethod
    def _price(cls, value: float | None) -> float | None:
        return _finite_positive(value, "max_price_per_hour (USD per instance-hour)")

    @field_validator("max_run_time_hours")
    @classmethod
    def _runtime(cls, value: float | None) -> float | None:
        return _finite_positive(value, "max_run_time_hours")

    @model_validator(mode="after")
    def _cross_field(self) -> TaskSpec:
        self._check_workers()
        self._check_paths()
        self._check_pool()
        self._check_stall()
        if self.distributed_mode == "auto":
            clashes = gang_variables_in(self.environment)
            if clashes:
                raise _FieldValueError("environment", (
                    f"sets {', '.join(clashes)}: distributed_mode='auto' gives each worker its "
                    "place in the gang through these; drop them from environment, or use "
                    "distributed_mode='manual' to set the rendezvous yourself"))
        return self

    def _check_workers(self) -> None:
        if self.min_instances is not None and not 1 <= self.min_instances <= self.num_instances:
            raise _FieldValueError("min_instances", f"min_instances must be between 1 and "
                                   f"num_instances ({self.num_instances}), got {self.min_instances}")
        if self.workers_per_node is not None:
            if not 1 <= self.workers_per_node <= MAX_WORKERS_PER_NODE:
                raise _FieldValueError("workers_per_node", (
                    f"workers_per_node must be between 1 and {MAX_WORKERS_PER_NODE}, got "
                    f"{self.workers_per_node}; leave it unset for one worker per GPU (or one "
                    "on a CPU node)"))
            if self.gpu is not None and self.gpu.count % self.workers_per_node:
                raise _FieldValueError("workers_per_node", (
                    f"workers_per_node={self.workers_per_node} does not divide gpu={self.gpu} "
                    "(each worker drives gpu count / workers_per_node GPUs); drop "
                    "workers_per_node"))
        if self.run_on == "head" and self.distributed_mode == "manual":
            raise _FieldValueError("run_on", "run_on='head' needs distributed_mode='auto' (the "
                                   "other workers wait for the head's trainers on MASTER_PORT)")
        if self.distributed_mode == "manual" and self.workers_per_node not in (None, 1):
            raise _FieldValueError("workers_per_node", (
                "distributed_mode='manual' runs one process per node; drop workers_per_node "
                "or use distributed_mode='auto'"))

    def _check_pool(self) -> None:
        if self.pool is None:
            for name, set_ in (("idle_stop", self.idle_stop is not None),
                               ("spares", self.spares > 0)):
                if set_:
                    raise _FieldValueError(name, (
                        f"{name} applies to a pool of warm nodes; add pool='NAME' (the pool "
                        "is made with this task's shape when it does not exist), or drop "
                        f"{name}"))
            return
        if self.min_instances not in (None, self.num_instances):
            raise _FieldValueError("min_instances", (
                "a task on a pool runs on the pool's nodes, which are up already; drop "
                "min_instances"))

    def _check_stall(self) -> None:
        stall = self.stall_timeout
        if isinstance(stall, float) and stall >= self.collective_timeout:
            raise _FieldValueError("stall_timeout", (
                f"stall_timeout ({stall:g}s) must be below collective_timeout "
                f"({self.collective_timeout:g}s): a rank that stops is found and named only "
                "before its peers' collectives time out; lower stall_timeout, raise "
                "collective_timeout, or use stall_timeout='auto' (at most half of "
                "collective_timeout)"))

    def _check_paths(self) -> None:
        paths = sorted([*self.volumes, *self.mounts])
        for i, outer in enumerate(paths):  # every pair: "/a", "/a-b", "/a/b" sort apart
            for inner in paths[i + 1:]:
                if inner == outer or inner.startswith(outer + "/"):
                    raise _FieldValueError("volumes" if inner in self.volumes else "mounts", (
                        f"mount paths {outer!r} and {inner!r} overlap; give each volume and "
                        "mount its own directory"))
        seen: dict[str, str] = {}
        for path, volume in sorted(self.volumes.items()):
            if volume.name in seen:
                raise _FieldValueError("volumes", (
                    f"volume {volume.name!r} is mounted at both {seen[volume.name]} and "
                    f"{path}; mount each volume once"))
            seen[volume.name] = path
        for path, volume in self.volumes.items():
            if volume.interface == "block" and self.num_instances > 1:
                raise _FieldValueError("volumes", (
                    f"volume {volume.name!r} at {path} uses interface='block', which attaches "
                    f"to one node only, and the task has {self.num_instances} nodes; use "
                    "interface='file' for a volume shared by all nodes"))

    @property
    def slots_per_node(self) -> int:
        """Worker processes per node: ``workers_per_node``, else one per GPU, else 1."""
        if self.distributed_mode == "manual":
            return 1
        if self.gpu is not None:
            return self.workers_per_node or self.gpu.count
        return self.workers_per_node or 1

    @property
    def world_size(self) -> int:
        return self.num_instances * self.slots_per_node


def _clean_message(message: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            return message[len(prefix):]
    return message


def build_task_spec(**options: Any) -> TaskSpec:
    """Validate user options into a TaskSpec, or raise ValidationError naming every bad field."""
    known = set(TaskSpec.model_fields)
    problems = []
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(FieldProblem(key, f"unknown option{hint}"))
    if problems:
        raise ValidationError(problems)
    try:
        return TaskSpec(**options)
    except pydantic.ValidationError as exc:
        raise ValidationError([_problem(e) for e in exc.errors()]) from None


def _problem(error: Any) -> FieldProblem:
    """One pydantic error as a FieldProblem; a cross-field check names the field it blames."""
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, _FieldValueError):
        return FieldProblem(cause.field, str(cause))
    parts = [str(p) for p in error["loc"] if p not in ("function-before", "function-after")]
    return FieldProblem(".".join(parts) or "task", _clean_message(error["msg"]))
