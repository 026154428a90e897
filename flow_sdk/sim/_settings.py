"""The simulated cloud's settings: ``aws-sim``'s provider_config, and the node settings each
simulated instance is played with (which a node's provider config carries under ``sim``, so
a node rebuilds the same simulated cloud when it starts replacements)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from flow_sdk.aws_clients import REGION_RE
from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws import AwsConfig

NODE_KEY = "sim"  # in a node's provider config: its NodeSettings
DEFAULT_REGION = "us-east-1"
DEFAULT_IDLE_STOP_S = 600.0
NODE_KEYS = ("root", "minute_s", "boot_delay_s", "wheelhouse", "python", "envs")
SIM_KEYS = ("idle_stop_s", "account_home", *NODE_KEYS)
# Set by the provider, never by a user: where the simulated account's keys are.
ACCOUNT_KEYS = "keys_file"
# The aws provider_config keys aws-sim passes on (a node's own launch and code excepted).
AWS_KEYS = tuple(f.name for f in fields(AwsConfig) if f.name not in ("launch", "code"))


@dataclass(frozen=True)
class NodeSettings:
    """How the simulated instances are played: each runs the node's real user-data."""

    root: str  # node directories, process records, EFS shared directories, shims
    # How many seconds one minute of a node's ``shutdown -h +N`` lasts (the runtime cap's
    # power-off timer); 60 is real time, less rehearses the cap quickly.
    minute_s: float = 60.0
    # The i-th instance of each launch waits this long before its user-data runs (a slow image
    # pull or network), to rehearse the boot clock against the availability clock.
    boot_delay_s: tuple[float, ...] = ()
    # Wheels pip may install on the nodes (no package index is ever reached); None: only what
    # the image (this machine's Python) already has.
    wheelhouse: str | None = None
    # The simulated image's python3 (the nodes' interpreter, and its bin directory on their
    # PATH for the AWS CLI): the interpreter of the process that first read the settings.
    python: str = sys.executable
    # Where the image keeps the SDK environments, by wheel digest (``/opt/flow/envs`` on every
    # instance); None: ``<root>/envs``. Simulated clouds that share it boot a wheel one of them
    # has seen without installing it again, as an image that carries it would.
    envs: str | None = None
    # The simulated account's key file (``_access``), which the instances read to play EC2
    # and to hand their nodes the credentials of their role; None: an AWS API that checks no
    # keys (``endpoint_url``), reached with dummy ones.
    keys_file: str | None = None

    @classmethod
    def from_mapping(cls, value: Any, where: str = "provider_config") -> NodeSettings:
        """``value`` checked; errors name ``<where>.<key>``."""
        if not isinstance(value, Mapping) or not isinstance(value.get("root"), str):
            raise ProviderError(f"{where} must be a mapping with 'root' (a directory for the "
                                "simulated nodes), e.g. {'root': '/tmp/flow-sim'}")
        unknown = sorted(set(value) - {*NODE_KEYS, ACCOUNT_KEYS})
        if unknown:
            raise ProviderError(f"{where} has unknown keys {unknown}; known: "
                                f"{', '.join(NODE_KEYS)}")
        return cls(root=value["root"], minute_s=_minute_s(value.get("minute_s", 60.0), where),
                   boot_delay_s=_delays(value.get("boot_delay_s") or (), where),
                   wheelhouse=_wheelhouse(value.get("wheelhouse"), where),
                   python=_absolute(value.get("python") or sys.executable, where, "python",
                                    "the absolute path of a python3 interpreter"),
                   envs=_absolute(value.get("envs"), where, "envs",
                                  "the absolute path of a directory"),
                   keys_file=_absolute(value.get(ACCOUNT_KEYS), where, ACCOUNT_KEYS,
                                       "the absolute path of the account's key file"))

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "minute_s": self.minute_s,
                "boot_delay_s": list(self.boot_delay_s), "wheelhouse": self.wheelhouse,
                "python": self.python, "envs": self.envs, ACCOUNT_KEYS: self.keys_file}


def _minute_s(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ProviderError(f"{where}.minute_s {value!r} must be a positive number of seconds "
                            "(60 is real time)")
    return float(value)


def _delays(value: Any, where: str) -> tuple[float, ...]:
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(d, (int, float)) and not isinstance(d, bool) and d >= 0 for d in value):
        raise ProviderError(f"{where}.boot_delay_s {value!r} must be a list of seconds >= 0, "
                            "one per instance of a launch, e.g. [0, 60]")
    return tuple(float(d) for d in value)


def _wheelhouse(value: Any, where: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ProviderError(f"{where}.wheelhouse {value!r} must be a directory of wheels")
    return value


def _absolute(value: Any, where: str, key: str, what: str) -> Any:
    if value is not None and (not isinstance(value, str) or not os.path.isabs(value)):
        raise ProviderError(f"{where}.{key} {value!r} must be {what}")
    return value


@dataclass(frozen=True)
class SimSettings:
    """The ``aws-sim`` provider_config (every key optional): the simulated account's server,
    how its instances are played, and any aws provider_config key (``endpoint_url`` names an
    AWS API that already runs, such as a test's moto server: then none is started)."""

    idle_stop_s: float = DEFAULT_IDLE_STOP_S  # the server stops after this long unused
    # With ``endpoint_url``: the home of the simulated account's server that it reaches (say
    # through a proxy), whose key file the provider and the instances use; None: an API that
    # checks no keys (a test's moto).
    account_home: str | None = None
    nodes: Mapping[str, Any] = field(default_factory=dict)  # NODE_KEYS given; root optional
    aws: Mapping[str, Any] = field(default_factory=dict)  # AWS_KEYS given

    @property
    def region(self) -> str:
        return str(self.aws.get("region") or DEFAULT_REGION)

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> SimSettings:
        known = sorted({*SIM_KEYS, *AWS_KEYS})
        unknown = sorted(set(config) - set(known))
        if unknown:
            raise ProviderError(f"provider_config has unknown key(s) {unknown} for the aws-sim "
                                f"provider; known keys: {', '.join(known)}")
        region = config.get("region") or DEFAULT_REGION
        if not isinstance(region, str) or not REGION_RE.match(region):
            raise ProviderError(f"provider_config.region {region!r} is not an AWS region name "
                                "such as 'us-east-1'")
        idle = config.get("idle_stop_s", DEFAULT_IDLE_STOP_S)
        if isinstance(idle, bool) or not isinstance(idle, (int, float)) or idle <= 0:
            raise ProviderError(f"provider_config.idle_stop_s {idle!r} must be a positive "
                                "number of seconds after which the idle simulated account's "
                                f"server stops (default {DEFAULT_IDLE_STOP_S:g})")
        nodes = {k: config[k] for k in NODE_KEYS if config.get(k) is not None}
        NodeSettings.from_mapping({"root": "/", **nodes})  # checked before anything starts
        aws = {k: config[k] for k in AWS_KEYS if k in config}
        AwsConfig.from_mapping({**aws, "region": region})
        home = _absolute(config.get("account_home"), "provider_config", "account_home",
                         "the absolute path of a simulated account's home directory")
        if home is not None and not aws.get("endpoint_url"):
            raise ProviderError("provider_config.account_home names the server that "
                                "endpoint_url reaches: give endpoint_url too, or drop both to "
                                "use this flow directory's own simulated account")
        return cls(idle_stop_s=float(idle), nodes=nodes, aws=aws, account_home=home)

    def node_settings(self, default_root: str) -> NodeSettings:
        return NodeSettings.from_mapping({"root": default_root, **self.nodes})

    def to_dict(self) -> dict[str, Any]:
        home = {} if self.account_home is None else {"account_home": self.account_home}
        return {**self.aws, "idle_stop_s": self.idle_stop_s, **home, **self.nodes}
