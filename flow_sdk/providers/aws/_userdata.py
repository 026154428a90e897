"""The node's user-data: one bash template (``bootstrap.sh.tmpl``) with shell-quoted values.

Every value is inserted as a single-quoted shell word, so no task input can change the script.
The rendered script must stay under EC2's 16 KB user-data limit (counted before base64).
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from importlib import resources

from flow_sdk.errors import ProviderError
from flow_sdk.wire import BootConfig, runtimecap

TEMPLATE_NAME = "bootstrap.sh.tmpl"
USER_DATA_LIMIT = 16 * 1024  # bytes, before base64
_PLACEHOLDER_RE = re.compile(r"@@([A-Z0-9_]+)@@")


@dataclass(frozen=True)
class NodeCode:
    """Where a node fetches the caller's SDK wheel and what it checks, and where its boot
    output goes."""

    url: str  # s3://<bucket>/<prefix>code/<sha256>.whl
    sha256: str
    filename: str  # the wheel's file name (pip reads name and version from it)
    python: str  # the caller's Python major.minor
    region: str  # the store's region: S3 and CloudWatch Logs
    log_group: str  # the task's log group (the node's boot stream lives in it)
    log_retention_days: int
    boot_timeout_s: int  # the agent must be up within this, or the node powers off
    bucket_owner: str | None = None  # the fetch passes it as the expected bucket owner


@dataclass(frozen=True)
class BootstrapInputs:
    """What the bootstrap needs to know about a task's nodes."""

    boot: BootConfig  # what the agent starts with, its secret empty: FLOW_BOOT as is
    code: NodeCode
    secret_parameter: str  # the SSM parameter that holds the secret (``_tasksecret``)
    image: str | None  # run the agent inside this container image
    gpus: bool  # pass the GPUs into the container
    interconnect: str  # "ethernet" or "efa"
    mount_paths: tuple[str, ...]  # task volume / mount paths passed into the container
    max_run_time_hours: float | None
    volume_mounts: str = ""  # bash lines from _efs/_ebs mount_script


def template() -> str:
    return resources.files("flow_sdk.providers.aws").joinpath(TEMPLATE_NAME).read_text("utf-8")


def render(inputs: BootstrapInputs) -> str:
    """The user-data script; raises ProviderError when it would exceed EC2's limit, or when
    the boot carries a secret (anyone allowed ec2:DescribeInstanceAttribute reads
    user-data: the nodes read the secret from ``secret_parameter``)."""
    if inputs.boot.secret:
        raise ProviderError("the node bootstrap would carry the task's secret in user-data; "
                            "the nodes read it from its SSM parameter")
    shutdown = 0
    if inputs.max_run_time_hours is not None:
        shutdown = (math.ceil(inputs.max_run_time_hours * 60)
                    + runtimecap.POWER_OFF.grace_minutes())
    values = {
        "BOOT_JSON": shlex.quote(inputs.boot.encode()),
        "SECRET_PARAMETER": shlex.quote(inputs.secret_parameter),
        "CODE_URL": shlex.quote(inputs.code.url),
        "BUCKET_OWNER": ("" if inputs.code.bucket_owner is None else
                         "--expected-bucket-owner " + shlex.quote(inputs.code.bucket_owner)),
        "CODE_SHA256": shlex.quote(inputs.code.sha256),
        "CODE_FILE": shlex.quote(inputs.code.filename),
        "PYTHON": shlex.quote(inputs.code.python),
        "REGION": shlex.quote(inputs.code.region),
        "LOG_GROUP": shlex.quote(inputs.code.log_group),
        "LOG_RETENTION": str(int(inputs.code.log_retention_days)),
        "BOOT_TIMEOUT": str(int(inputs.code.boot_timeout_s)),
        "IMAGE": shlex.quote(inputs.image or ""),
        "GPUS": "1" if inputs.gpus else "0",
        "INTERCONNECT": shlex.quote(inputs.interconnect),
        "MOUNT_PATHS": " ".join(shlex.quote(p) for p in inputs.mount_paths),
        "SHUTDOWN_MINUTES": str(shutdown),
        "VOLUME_MOUNTS": inputs.volume_mounts.rstrip("\n") or ":",
    }

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ProviderError(f"user-data template has an unknown placeholder @@{name}@@")
        return values[name]

    script = _PLACEHOLDER_RE.sub(fill, template())
    size = len(script.encode("utf-8"))
    if size > USER_DATA_LIMIT:
        raise ProviderError(f"the node bootstrap is {size} bytes, over EC2's {USER_DATA_LIMIT}"
                            "-byte user-data limit; shorten provider_config (prefix, "
                            "log_group_prefix) or the image name")
    return script


def interconnect_of(value: str | None) -> str:
    """``efa`` for EFA or InfiniBand (AWS's fabric is EFA), else ``ethernet``."""
    return "efa" if (value or "").lower() in ("efa", "infiniband") else "ethernet"
