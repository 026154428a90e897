"""The parts of a task spec (``flow_sdk.spec``): the GPU and volume requests, and the checks of
mount paths, S3 sources and how a node's GPUs are linked. Each raises ``ValueError`` with the
fix; ``spec.build_task_spec`` reports it under the field it came from."""

from __future__ import annotations

import difflib
import posixpath
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flow_sdk.catalog import GPU_MODELS, INTRANODE_INTERCONNECTS, find_gpu_model
from flow_sdk.spec.s3uri import BUCKET_RE, S3UriError, split_s3_uri

MAX_GPUS_PER_NODE = 16
ANY_GPU_MODEL = "any"  # a model-less request: whatever GPUs the local machine has
_ANY_GPU_NAMES = (ANY_GPU_MODEL, "gpu")

_GPU_RE = re.compile(
    r"^(?P<name>[a-z][a-z0-9]*?)"
    r"(?:-(?P<mem>\d+)gb)?"
    r"(?:\.(?P<form>[a-z]+))?"
    r"(?::(?P<count>-?\d+)|\.(?P<countx>-?\d+)x)?$"
)
_VOLUME_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
MAX_BLOCK_VOLUME_GB = 16384  # EBS gp3

# Mounting over these (or under the first group) would break the node's operating system.
_SYSTEM_TREES = ("/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32",
                 "/lib64", "/boot", "/run")
_SYSTEM_EXACT = ("/", "/var", "/tmp", "/home", "/root", "/opt", "/srv", "/mnt")


class FrozenModel(BaseModel):
    """A spec part: unknown keys refused, immutable once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSpec(FrozenModel):
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


class VolumeSpec(FrozenModel):
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


def volume_input(value: Any) -> Any:
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
