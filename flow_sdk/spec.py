"""The task description: every option of ``@app.function`` validated into a ``TaskSpec``.

ALL validation of user input happens here, when the decorator runs, before any provider call.
A rejected option raises :class:`flow_sdk.errors.ValidationError` naming the field and the fix.
"""

from __future__ import annotations

import difflib
import math
import posixpath
import re
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from flow_sdk.catalog import GPU_MODELS, INTRANODE_INTERCONNECTS, find_gpu_model
from flow_sdk.errors import FieldProblem, ValidationError
from flow_sdk.s3uri import BUCKET_RE, S3UriError, split_s3_uri

MAX_GPUS_PER_NODE = 16
MAX_INSTANCES = 4096
MAX_WORKERS_PER_NODE = 256
ANY_GPU_MODEL = "any"  # a model-less request: whatever GPUs the local machine has
_ANY_GPU_NAMES = (ANY_GPU_MODEL, "gpu")

_GPU_RE = re.compile(
    r"^(?P<name>[a-z][a-z0-9]*?)"
    r"(?:-(?P<mem>\d+)gb)?"
    r"(?:\.(?P<form>[a-z]+))?"
    r"(?::(?P<count>-?\d+)|\.(?P<countx>-?\d+)x)?$"
)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_VOLUME_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
MAX_BLOCK_VOLUME_GB = 16384  # EBS gp3

# A worker's place in the gang: distributed_mode="auto" computes these (and FLOW_*, but for
# the user's settings), so an ``environment`` value would give workers one rank or a wrong leader.
GANG_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                  "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
USER_FLOW_VARIABLES = ("FLOW_MAX_RESULT_BYTES",)

# Mounting over these (or under the first group) would break the node's operating system.
_SYSTEM_TREES = ("/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32",
                 "/lib64", "/boot", "/run")
_SYSTEM_EXACT = ("/", "/var", "/tmp", "/home", "/root", "/opt", "/srv", "/mnt")

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
                  or (k.startswith("FLOW_") and k not in USER_FLOW_VARIABLES))


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSpec(_Frozen):
    """A GPU request per node: model, memory, form factor and count."""

    model: str
    memory_gb: int
    form_factor: str
    count: int = Field(ge=1, le=MAX_GPUS_PER_NODE)

    @classmethod
    def parse(cls, text: str) -> GpuSpec:
        """Parse the forms users write: ``h100:8``, ``H100:8``, ``a100-80gb:4``,
        ``h100-80gb.sxm.8x``, ``a10g`` (one GPU); ``any:2`` (or ``gpu:2``) takes GPUs of any
        model (the local provider hands out what the machine has)."""
        if not isinstance(text, str):
            raise ValueError(f"expected a string such as 'h100:8', got {type(text).__name__}")
        match = _GPU_RE.match(text.strip().lower())
        if match is None:
            raise ValueError(
                f"cannot parse GPU spec {text!r}; write MODEL[:COUNT], e.g. 'h100:8', "
                "'a100-80gb:4' or 'h100-80gb.sxm.8x'"
            )
        if match["name"] in _ANY_GPU_NAMES:
            if match["mem"] or match["form"]:
                raise ValueError(f"{text!r}: a model-less GPU request takes no memory or form "
                                 "factor; write 'any:COUNT' or name the model, e.g. 'h100-80gb:8'")
            return cls(model=ANY_GPU_MODEL, memory_gb=0, form_factor=ANY_GPU_MODEL,
                       count=_gpu_count(match["count"] or match["countx"]))
        model = find_gpu_model(match["name"])
        if model is None:
            known = ", ".join(m.name for m in GPU_MODELS)
            close = difflib.get_close_matches(match["name"], [m.name for m in GPU_MODELS], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown GPU model {match['name']!r}{hint}; known models: {known}")
        memory = int(match["mem"]) if match["mem"] else model.default_memory_gb
        if memory not in model.memory_gb:
            sizes = ", ".join(f"{m}gb" for m in model.memory_gb)
            raise ValueError(f"{model.name} comes with {sizes}, not {memory}gb")
        form = match["form"] or model.form_factors[0]
        if form not in model.form_factors:
            raise ValueError(f"{model.name} comes as {', '.join(model.form_factors)}, not {form!r}")
        count = _gpu_count(match["count"] or match["countx"])
        return cls(model=model.name, memory_gb=memory, form_factor=form, count=count)

    def __str__(self) -> str:
        if self.model == ANY_GPU_MODEL:
            return f"{ANY_GPU_MODEL}:{self.count}"
        return f"{self.model}-{self.memory_gb}gb.{self.form_factor}:{self.count}"


def _gpu_count(raw: str | None) -> int:
    count = int(raw) if raw is not None else 1
    if count < 1:
        raise ValueError(f"GPU count must be at least 1 (got {count}); for CPU nodes pass gpu=None")
    if count > MAX_GPUS_PER_NODE:
        raise ValueError(f"at most {MAX_GPUS_PER_NODE} GPUs per node (got {count}); "
                         "use num_instances for more nodes")
    return count


class VolumeSpec(_Frozen):
    """A named persistent volume mounted at a path on the nodes.

    ``interface="file"`` is shared by every node (a directory locally, EFS on AWS);
    ``interface="block"`` attaches to one node only (a directory locally, EBS on AWS).
    """

    name: str
    size_gb: int = Field(default=100, ge=1, le=65536)
    interface: Literal["file", "block"] = "file"

    @field_validator("name")
    @classmethod
    def _name_is_safe(cls, value: str) -> str:
        if not _VOLUME_NAME_RE.match(value):
            raise ValueError(
                f"volume name {value!r} must be 1-63 characters of a-z, 0-9, '-' and '_', "
                "starting with a letter or digit"
            )
        return value

    @model_validator(mode="after")
    def _block_size(self) -> VolumeSpec:
        if self.interface == "block" and self.size_gb > MAX_BLOCK_VOLUME_GB:
            raise ValueError(f"a block volume holds at most {MAX_BLOCK_VOLUME_GB} GB "
                             f"(got {self.size_gb}); use interface='file' for more")
        return self


def _volume_input(value: Any) -> Any:
    """Accept a volume's name (``"ckpt"``) or an object with ``to_volume_spec()`` (``Volume``)
    wherever a volume mapping or ``VolumeSpec`` is expected."""
    if isinstance(value, str):
        return {"name": value}
    to_spec = getattr(value, "to_volume_spec", None)
    return to_spec() if callable(to_spec) else value


def check_mount_path(path: str) -> str:
    """An absolute, normalized path that is not a system directory; returns it unchanged."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"mount path {path!r} must be absolute, e.g. '/shared/data'")
    if ".." in path.split("/"):
        raise ValueError(f"mount path {path!r} must not contain '..'")
    normalized = posixpath.normpath(path)
    if normalized != (path.rstrip("/") or "/") or "//" in path:
        raise ValueError(f"mount path {path!r} is not normalized; write {normalized!r}")
    if normalized in _SYSTEM_EXACT or any(
        normalized == tree or normalized.startswith(tree + "/") for tree in _SYSTEM_TREES
    ):
        raise ValueError(f"mount path {path!r} would cover a system directory; use a path such as "
                         f"'/shared{normalized if normalized != '/' else '/data'}'")
    return normalized


def check_s3_uri(uri: str) -> str:
    try:
        bucket, _ = split_s3_uri(uri)
    except S3UriError:
        bucket = ""
    if not BUCKET_RE.match(bucket):
        raise ValueError(f"mount source {uri!r} must be an S3 URI such as 's3://bucket/prefix'")
    if ".." in uri.split("/"):
        raise ValueError(f"mount source {uri!r} must not contain '..'")
    return uri


def check_intranode(value: str, gpu: GpuSpec | None) -> str:
    """``value`` (lower-cased) when the catalog says ``gpu``'s GPUs link that way inside a
    node (``sxm5`` for ``h100:8``); raises naming the values allowed and the fix."""
    link = value.strip().lower()
    if link not in INTRANODE_INTERCONNECTS:
        raise ValueError(f"unknown intranode interconnect {value!r}; the catalog knows "
                         f"{', '.join(INTRANODE_INTERCONNECTS)}")
    if gpu is None or gpu.model == ANY_GPU_MODEL:
        raise ValueError(f"intranode_interconnect={value!r} is how a node's GPUs are linked, so it "
                         "needs a named GPU model (e.g. gpu='h100:8' for 'sxm5'); drop it for "
                         f"{'CPU nodes' if gpu is None else repr(str(gpu))}")
    model = find_gpu_model(gpu.model)
    assert model is not None  # GpuSpec.parse accepted it from the same table
    allowed = model.intranode_of(gpu.form_factor)
    if link == allowed:
        return link
    form = model.form_with(link)
    if form is not None:
        fix = f"ask for gpu='{gpu.model}-{gpu.memory_gb}gb.{form}:{gpu.count}' to get {link}"
    else:
        having = [m.name for m in GPU_MODELS if link in m.intranode]
        fix = f"{link} comes with {', '.join(having)} GPUs"
    raise ValueError(f"gpu='{gpu}' links its GPUs over {allowed}, not {link} (allowed for "
                     f"{model.name}: {', '.join(model.intranode)}); {fix}, or drop "
                     "intranode_interconnect")


def _finite_positive(value: float | None, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive number (got {value!r}); leave it unset for no cap")
    return float(value)


class TaskSpec(_Frozen):
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
    preflight: bool = False
    key_name: str | None = None
    # Modules shipped by value besides the caller's own files: installed packages the nodes
    # lack (an editable install of your own library), by importable dotted name.
    include: tuple[str, ...] = ()

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
            return {check_mount_path(path): _volume_input(spec) for path, spec in value.items()}
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
