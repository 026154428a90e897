"""The Slurm provider's configuration (``provider_config``), checked: where the shared folder
is, which interpreter the nodes run, and what the site adds to each job."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flow_sdk.errors import ProviderError
from flow_sdk.providers.slurm._batch import JobOptions

_CONFIG_KEYS = ("shared_dir", "python", "partition", "account", "qos", "constraint",
                "extra_sbatch", "gpu_types", "priority_qos", "usd_per_node_hour", "login",
                "ssh_config")
DEFAULT_SHARED_DIR = "~/.flow-slurm"  # under the user's home where the commands run
_PRIORITIES = ("low", "med", "high")


@dataclass(frozen=True)
class SlurmSettings:
    """The provider's configuration (``provider_config``), checked."""

    shared_dir: str  # absolute, or under ``~`` of the machine the commands run on
    python: str  # the interpreter the nodes run: the caller's by default
    options: JobOptions = JobOptions()
    gpu_types: Mapping[str, str] = field(default_factory=dict)  # catalog name -> GRES type
    usd_per_node_hour: float | None = None  # what a node-hour costs: cost shown, price caps
    login: str | None = None  # "user@host" (or a Host of the SSH config) of a login node
    ssh_config: str | None = None  # the SSH config file for ``login``: the user's by default

    @classmethod
    def parse(cls, config: Mapping[str, Any]) -> SlurmSettings:
        unknown = sorted(set(config) - set(_CONFIG_KEYS))
        if unknown:
            raise ProviderError(f"provider_config has unknown key(s) {unknown} for the slurm "
                                f"provider; it takes {', '.join(_CONFIG_KEYS)}")
        texts = {key: config.get(key) for key in ("partition", "account", "qos", "constraint")}
        for key, value in texts.items():
            if value is not None and (not isinstance(value, str) or not value
                                      or any(c.isspace() for c in value)):
                raise ProviderError(f"provider_config[{key!r}] must be one word (a Slurm "
                                    f"{key} name), not {value!r}")
        extra = config.get("extra_sbatch") or []
        if not isinstance(extra, list) or not all(
                isinstance(line, str) and line.startswith("--") and "\n" not in line
                for line in extra):
            raise ProviderError("provider_config['extra_sbatch'] must be a list of sbatch "
                                "options, each one line starting with '--' (like "
                                "'--mem=0'), not " + repr(extra))
        gpu_types = config.get("gpu_types") or {}
        if not isinstance(gpu_types, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and v for k, v in gpu_types.items()):
            raise ProviderError("provider_config['gpu_types'] maps a GPU name of gpu= to the "
                                "cluster's GRES type, like {'h100': 'nvidia_h100_80gb'}")
        priority_qos = config.get("priority_qos") or {}
        if not isinstance(priority_qos, dict) or not all(
                k in _PRIORITIES and isinstance(v, str) and v and not any(c.isspace() for c in v)
                for k, v in priority_qos.items()):
            raise ProviderError("provider_config['priority_qos'] maps a priority= value "
                                f"({', '.join(_PRIORITIES)}) to one of the cluster's QoS "
                                "names, like {'high': 'urgent', 'low': 'scavenger'}, not "
                                + repr(priority_qos))
        price = config.get("usd_per_node_hour")
        if price is not None and (isinstance(price, bool) or not isinstance(price, int | float)
                                  or not 0 <= price < 10_000):
            raise ProviderError("provider_config['usd_per_node_hour'] is what one node-hour "
                                f"of the partition costs, in USD (like 2.5), not {price!r}")
        login, ssh_config = _login(config)
        shared = config.get("shared_dir") or DEFAULT_SHARED_DIR
        if not isinstance(shared, str) or not (shared.startswith("/") or shared == "~"
                                               or shared.startswith("~/")):
            raise ProviderError("provider_config['shared_dir'] is a folder on the cluster's "
                                "shared filesystem that every node sees: an absolute path, "
                                f"or one under your home folder (~/...), not {shared!r}")
        python = config.get("python") or (None if login else sys.executable)
        if not isinstance(python, str) or not python.startswith("/"):
            raise ProviderError("provider_config['python'] must be an absolute path to the "
                                f"interpreter the nodes run, not {python!r}" + (
                                    " (with login=, this machine's interpreter means nothing "
                                    "there: name the cluster's, of this Python version)"
                                    if login else ""))
        return cls(shared, python, JobOptions(extra_sbatch=tuple(extra),
                                              priority_qos=dict(priority_qos), **texts),
                   dict(gpu_types), None if price is None else float(price), login, ssh_config)

    def to_config(self) -> dict[str, Any]:
        options = self.options
        config: dict[str, Any] = {"shared_dir": self.shared_dir, "python": self.python}
        for key in ("partition", "account", "qos", "constraint"):
            if getattr(options, key):
                config[key] = getattr(options, key)
        if options.extra_sbatch:
            config["extra_sbatch"] = list(options.extra_sbatch)
        if options.priority_qos:
            config["priority_qos"] = dict(options.priority_qos)
        if self.gpu_types:
            config["gpu_types"] = dict(self.gpu_types)
        if self.usd_per_node_hour is not None:
            config["usd_per_node_hour"] = self.usd_per_node_hour
        for key in ("login", "ssh_config"):
            if getattr(self, key):
                config[key] = getattr(self, key)
        return config


def _login(config: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``login`` and ``ssh_config``, checked (the config file made absolute here)."""
    login, ssh_config = config.get("login"), config.get("ssh_config")
    if login is not None and (not isinstance(login, str) or not login or login.startswith("-")
                              or any(c.isspace() for c in login)):
        raise ProviderError("provider_config['login'] names the cluster's login node as ssh "
                            f"takes it: 'user@host' or a Host of your SSH config, not {login!r}")
    if ssh_config is not None:
        if login is None:
            raise ProviderError("provider_config['ssh_config'] is for reaching the login "
                                "node: give provider_config['login'] too")
        path = Path(ssh_config).expanduser() if isinstance(ssh_config, str) else None
        if path is None or not path.is_file():
            raise ProviderError("provider_config['ssh_config'] must be an SSH config file "
                                f"on this machine, not {ssh_config!r}")
        ssh_config = str(path.resolve())
    return login, ssh_config
