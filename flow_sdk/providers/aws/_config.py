"""The ``aws`` provider's settings: JSON-safe, credential-free, validated once.

The same mapping rebuilds the provider on the client, in ``Task.from_id`` and on every node
(it travels in ``FLOW_BOOT``), so it must never hold a secret: nodes get credentials from their
instance profile (real AWS), or from whatever their node runtime gives their processes.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from flow_sdk.aws_clients import REGION_RE, default_region
from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws._credentials import reject_credentials
from flow_sdk.providers.aws._imds import IMDS_ENDPOINT
from flow_sdk.providers.launch import ShippedWheel

# The AWS Deep Learning AMI with PyTorch (OSS NVIDIA driver, Ubuntu 24.04): the NVIDIA
# driver, CUDA, NCCL with the EFA plugin, Docker with the NVIDIA container toolkit, the AWS
# CLI, and PyTorch preinstalled in the venv at /opt/pytorch (Python 3.12), so no node
# reinstalls torch on boot. Published per region as a public SSM parameter. It supports the
# G4dn, G5, G6, Gr6, G6e, P4d, P4de, P5, P5e, P5en and P6-B200 instance families (NVIDIA
# Turing, Ampere, Ada Lovelace, Hopper and Blackwell GPUs); not P3 (Volta).
DLAMI_PARAMETER = ("/aws/service/deeplearning/ami/x86_64/"
                   "oss-nvidia-driver-gpu-pytorch-2.9-ubuntu-24.04/latest/ami-id")
DLAMI_PYTHON = "3.12"  # the Python of that image's /opt/pytorch venv
DEFAULT_PREFIX = "flow/"
DEFAULT_LOG_GROUP_PREFIX = "/flow/"
DEFAULT_SSH_USER = "ubuntu"  # the Deep Learning AMI (Ubuntu) login user
# Task objects (records, results, errors) expire this many days after they were written (an
# S3 lifecycle rule on the bucket); provider_config object_expiry_days changes it.
DEFAULT_OBJECT_EXPIRY_DAYS = 30
MAX_OBJECT_EXPIRY_DAYS = 3650
# The broadest SSH source a task's security group may admit ("the caller", never the internet).
MIN_SSH_PREFIX = {4: 16, 6: 48}

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SSH_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_PYTHON_RE = re.compile(r"^3\.\d{1,2}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_ACCOUNT_RE = re.compile(r"^[0-9]{12}$")
_IMDS_RE = re.compile(r"^http://[A-Za-z0-9.:\[\]-]+(?::\d+)?(?:/[A-Za-z0-9._{}/-]*)?$")
_PREFIX_RE = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]*/)*")
_LOG_GROUP_RE = re.compile(r"[A-Za-z0-9._/#-]{1,400}")


@dataclass(frozen=True)
class NodeLaunch:
    """Where a task's gang landed; set in the config the nodes of that gang boot with."""

    task_id: str
    region: str
    attempt: int


@dataclass(frozen=True)
class AwsConfig:
    region: str  # home region: the S3 bucket, CloudWatch Logs, the default launch region
    regions: tuple[str, ...] = ()  # launch regions in order of preference; () = (region,)
    bucket: str | None = None  # None: flow-sdk-<account>-<region>, created on first use
    # The account that must own the bucket: every S3 call passes it as ExpectedBucketOwner,
    # so a bucket of that name owned by anyone else is refused. None with the default bucket:
    # the caller's account (from STS); None with a named bucket: not checked.
    bucket_owner: str | None = None
    prefix: str = DEFAULT_PREFIX  # key prefix inside the bucket
    endpoint_url: str | None = None  # one AWS-compatible endpoint for every service; None for AWS
    ssh_cidr: str | None = None  # who may SSH to nodes; None: this machine's public IP /32
    instance_profile: str | None = None  # None: flow-sdk-node-<hash>, created when missing
    ami_id: str | None = None  # overrides the SSM parameter in every region
    ami_ssm_parameter: str = DLAMI_PARAMETER
    # The Python ``major.minor`` of the image's interpreter; None: the default image's
    # (DLAMI_PYTHON). Name it when ami_id or ami_ssm_parameter picks another image.
    image_python: str | None = None
    log_group_prefix: str = DEFAULT_LOG_GROUP_PREFIX
    log_retention_days: int = 30
    # Days after which S3 expires task objects (tasks/ under the prefix); None: no lifecycle
    # rule (objects stay until `flow gc --older-than`).
    object_expiry_days: int | None = DEFAULT_OBJECT_EXPIRY_DAYS
    max_launch_attempts: int = 32
    # Where a node reads its instance metadata (spot interruption notices). None: the real
    # IMDS on EC2 (a provider with another node runtime may have none). A
    # "{instance_id}" in it is replaced by the asking node's id (one host plays many nodes).
    imds_endpoint: str | None = None
    # SSH to nodes (Task.ssh): the AMI's login user, which address the client dials, and the
    # private key file for a user-named key pair (a per-task key is written at launch)
    ssh_user: str = DEFAULT_SSH_USER
    ssh_address: str = "public"  # "public" | "private" (a VPN or bastion reaches the VPC)
    ssh_key_path: str | None = None
    launch: NodeLaunch | None = None  # set on nodes only
    code: ShippedWheel | None = None  # set on nodes only: the SDK wheel they install

    @property
    def launch_regions(self) -> tuple[str, ...]:
        return self.regions or (self.region,)

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> AwsConfig:
        """Validate ``config`` (the provider_config a user passes, or ``to_dict()`` output)."""
        reject_credentials(config)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(config) - known)
        if unknown:
            raise ProviderError(f"provider_config has unknown key(s) {unknown} for the aws "
                                f"provider; known keys: {', '.join(sorted(known))}")
        region = default_region(config.get("region"))
        _check_region(region, "region")
        regions = tuple(config.get("regions") or ())
        if isinstance(config.get("regions"), str):
            raise ProviderError("provider_config.regions must be a list such as "
                                "['us-east-1', 'us-west-2'], not a string")
        for name in regions:
            _check_region(name, "regions")
        bucket, bucket_owner = _bucket_settings(config)
        expiry = _expiry_days(config.get("object_expiry_days", DEFAULT_OBJECT_EXPIRY_DAYS))
        prefix, log_groups = _name_prefixes(config)
        ssh_cidr = config.get("ssh_cidr")
        if ssh_cidr is not None:
            ssh_cidr = check_ssh_cidr(ssh_cidr)
        retention = int(config.get("log_retention_days", 30))
        attempts = int(config.get("max_launch_attempts", 32))
        if attempts < 1:
            raise ProviderError("provider_config.max_launch_attempts must be at least 1")
        imds = config.get("imds_endpoint")
        if imds is not None and (not isinstance(imds, str) or not _IMDS_RE.match(imds)):
            raise ProviderError(f"provider_config.imds_endpoint {imds!r} must be an http:// URL "
                                f"such as {IMDS_ENDPOINT!r} (the instance metadata service)")
        ssh_user, ssh_address, ssh_key_path = _ssh_settings(config)
        image_python = config.get("image_python")
        if image_python is not None and (not isinstance(image_python, str)
                                         or not _PYTHON_RE.match(image_python)):
            raise ProviderError(f"provider_config.image_python {image_python!r} must be the "
                                "image's Python major.minor, such as '3.12'")
        launch = config.get("launch")
        code = config.get("code")
        return cls(
            region=region, regions=regions, bucket=bucket, bucket_owner=bucket_owner,
            prefix=prefix,
            endpoint_url=config.get("endpoint_url"), ssh_cidr=ssh_cidr,
            instance_profile=config.get("instance_profile"), ami_id=config.get("ami_id"),
            ami_ssm_parameter=config.get("ami_ssm_parameter") or DLAMI_PARAMETER,
            image_python=image_python,
            log_group_prefix=log_groups,
            log_retention_days=retention, object_expiry_days=expiry,
            max_launch_attempts=attempts, imds_endpoint=imds,
            ssh_user=ssh_user, ssh_address=ssh_address, ssh_key_path=ssh_key_path,
            launch=NodeLaunch(**launch) if launch is not None else None,
            code=_code(code) if code is not None else None,
        )

    @property
    def default_image(self) -> bool:
        """Whether the nodes boot the default Deep Learning AMI."""
        return self.ami_id is None and self.ami_ssm_parameter == DLAMI_PARAMETER

    @property
    def node_python(self) -> str | None:
        """The Python ``major.minor`` of the nodes' image: ``image_python``, else the default
        image's; None when another image is configured without ``image_python``."""
        if self.image_python is not None:
            return self.image_python
        return DLAMI_PYTHON if self.default_image else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe mapping ``from_mapping`` takes back (no credentials, by construction)."""
        data: dict[str, Any] = {
            "region": self.region, "regions": list(self.regions), "bucket": self.bucket,
            "bucket_owner": self.bucket_owner,
            "prefix": self.prefix, "endpoint_url": self.endpoint_url, "ssh_cidr": self.ssh_cidr,
            "instance_profile": self.instance_profile, "ami_id": self.ami_id,
            "ami_ssm_parameter": self.ami_ssm_parameter, "image_python": self.image_python,
            "log_group_prefix": self.log_group_prefix,
            "log_retention_days": self.log_retention_days,
            "object_expiry_days": self.object_expiry_days,
            "max_launch_attempts": self.max_launch_attempts,
            "imds_endpoint": self.imds_endpoint, "ssh_user": self.ssh_user,
            "ssh_address": self.ssh_address, "ssh_key_path": self.ssh_key_path,
        }
        if self.launch is not None:
            data["launch"] = {"task_id": self.launch.task_id, "region": self.launch.region,
                              "attempt": self.launch.attempt}
        if self.code is not None:
            data["code"] = {"key": self.code.key, "sha256": self.code.sha256,
                            "filename": self.code.filename, "python": self.code.python}
        return data

    def for_node(self, task_id: str, region: str, attempt: int, code: ShippedWheel
                 ) -> AwsConfig:
        """The config the nodes of one launched gang boot with: where they landed and the
        SDK wheel they install."""
        return replace(self, launch=NodeLaunch(task_id, region, attempt), code=code)


def _bucket_settings(config: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """provider_config ``bucket`` and ``bucket_owner``, checked."""
    bucket = config.get("bucket")
    if bucket is not None and not _BUCKET_RE.match(bucket):
        raise ProviderError(f"provider_config.bucket {bucket!r} is not a valid S3 bucket "
                            "name (3-63 characters of a-z, 0-9, '.' and '-')")
    bucket_owner = config.get("bucket_owner")
    if bucket_owner is not None and (not isinstance(bucket_owner, str)
                                     or not _ACCOUNT_RE.match(bucket_owner)):
        raise ProviderError(f"provider_config.bucket_owner {bucket_owner!r} must be the "
                            "12-digit id of the AWS account that owns the bucket, e.g. "
                            "'123456789012'")
    return bucket, bucket_owner


def _ssh_settings(config: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """provider_config ``ssh_user``, ``ssh_address`` and ``ssh_key_path``, checked."""
    ssh_user = config.get("ssh_user") or DEFAULT_SSH_USER
    if not isinstance(ssh_user, str) or not _SSH_USER_RE.match(ssh_user):
        raise ProviderError(f"provider_config.ssh_user {ssh_user!r} is not a login name "
                            f"such as {DEFAULT_SSH_USER!r}")
    ssh_address = config.get("ssh_address") or "public"
    if ssh_address not in ("public", "private"):
        raise ProviderError(f"provider_config.ssh_address {ssh_address!r} must be 'public' "
                            "or 'private'")
    ssh_key_path = config.get("ssh_key_path")
    if ssh_key_path is not None and (not isinstance(ssh_key_path, str) or not ssh_key_path):
        raise ProviderError(f"provider_config.ssh_key_path {ssh_key_path!r} must be the "
                            "path of a private key file")
    return ssh_user, ssh_address, ssh_key_path


def _check_region(name: Any, key: str) -> None:
    if not isinstance(name, str) or not REGION_RE.match(name):
        raise ProviderError(f"provider_config.{key}: {name!r} is not an AWS region name such "
                            "as 'us-east-1'")


def _expiry_days(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not (
            1 <= value <= MAX_OBJECT_EXPIRY_DAYS):
        raise ProviderError(f"provider_config.object_expiry_days {value!r} must be a whole "
                            f"number of days from 1 to {MAX_OBJECT_EXPIRY_DAYS} (default "
                            f"{DEFAULT_OBJECT_EXPIRY_DAYS}), or null to keep task objects "
                            "until `flow gc --older-than` removes them")
    return value


def _name_prefixes(config: Mapping[str, Any]) -> tuple[str, str]:
    """``prefix`` and ``log_group_prefix``: they become parts of the task's IAM resource
    names, so they may hold no wildcard or path trick."""
    prefix = config.get("prefix", DEFAULT_PREFIX)
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise ProviderError(f"provider_config.prefix {prefix!r} must be empty or a relative "
                            "path ending in '/' of letters, digits, '.', '_' and '-', e.g. "
                            "'flow/' (it becomes part of the task's IAM resource names: no "
                            "wildcards)")
    log_groups = config.get("log_group_prefix") or DEFAULT_LOG_GROUP_PREFIX
    if not isinstance(log_groups, str) or not _LOG_GROUP_RE.fullmatch(log_groups):
        raise ProviderError(f"provider_config.log_group_prefix {log_groups!r} must be "
                            "letters, digits and '.', '_', '-', '/', '#', e.g. '/flow/' (it "
                            "becomes part of the task's IAM resource names: no wildcards)")
    return prefix, log_groups


def _code(value: Any) -> ShippedWheel:
    keys = ("key", "sha256", "filename", "python")
    if (not isinstance(value, Mapping) or sorted(value) != sorted(keys)
            or not all(isinstance(value[k], str) for k in keys)
            or not _SHA256_RE.match(value["sha256"]) or not _PYTHON_RE.match(value["python"])):
        raise ProviderError("provider_config.code must be the SDK wheel a launch stored: "
                            f"{{{', '.join(repr(k) for k in keys)}}} (set by the client at "
                            "launch, never by hand)")
    return ShippedWheel(**{k: value[k] for k in keys})


def check_ssh_cidr(value: str) -> str:
    """The CIDR SSH is allowed from: the caller's address or network, never the internet
    (nothing broader than /16 for IPv4 or /48 for IPv6)."""
    try:
        network = ipaddress.ip_network(value, strict=False)
    except (TypeError, ValueError):
        raise ProviderError(f"provider_config.ssh_cidr {value!r} is not a CIDR such as "
                            "'203.0.113.7/32'") from None
    broadest = MIN_SSH_PREFIX[network.version]
    if network.prefixlen < broadest:
        whole = " to the whole internet" if network.prefixlen == 0 else (
            f" to {network.num_addresses:,} addresses")
        raise ProviderError(f"provider_config.ssh_cidr {value!r} would open SSH{whole}; give "
                            f"your own address or network (at most a /{broadest}), e.g. "
                            "'203.0.113.7/32'")
    return str(network)
