"""The boot configuration: what every node agent of a task is started with.

One typed object from the client to the agent. The client builds it, a provider may set the
provider config its nodes use (``with_provider_config``), and the provider carries the text
of :meth:`BootConfig.encode` to the node: in a 0600 file named by ``FLOW_BOOT_FILE`` (local
nodes, so the secret stays out of argv and environment dumps), or in ``FLOW_BOOT`` with the
secret left out and the secret alone in a 0600 file named by ``FLOW_SECRET_FILE`` (EC2: the
user-data sets ``FLOW_BOOT``, and the bootstrap fetches the secret, which user-data never
holds). The agent takes it with :func:`take_node_boot`, the one place that reads the secret,
which removes both files; :func:`node_boot` reads the rest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flow_sdk.errors import RecordError
import flow_sdk.wire.safejson as safejson
import flow_sdk.wire.envvars as envvars

MAX_BOOT_BYTES = 1 << 20  # a boot configuration is a few KB

_FIELDS = ("task_id", "provider", "provider_config", "secret", "role")
ROLES = ("task", "pool")  # a node of one task, or a node of a pool (its daemon runs tasks)


@dataclass(frozen=True)
class BootConfig:
    """What a node agent is started with (the same for every node of a gang)."""

    task_id: str
    provider: str  # the provider's registered name; the agent rebuilds it with the config
    provider_config: Mapping[str, Any]  # plain JSON data (the provider's ``config()``)
    secret: str = ""  # the task's secret (hex, flow_sdk.wire.signing); never in the store
    # "task": the node runs this task's agent and stops with it. "pool": ``task_id`` is the
    # pool's id, ``secret`` the pool's, and the node runs the pool's daemon.
    role: str = "task"

    @property
    def node_module(self) -> str:
        """The module a node runs (``python -m``) for this boot."""
        return "flow_sdk.node.pool" if self.role == "pool" else "flow_sdk.node.agent"

    def with_provider_config(self, config: Mapping[str, Any]) -> BootConfig:
        """The same boot with the provider config a provider's nodes use."""
        return replace(self, provider_config=dict(config))

    def encode(self) -> str:
        """The configuration as one line of JSON (the only encoder)."""
        data = {"task_id": self.task_id, "provider": self.provider,
                "provider_config": dict(self.provider_config), "secret": self.secret,
                "role": self.role}
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> BootConfig:
        """The configuration :meth:`encode` wrote (the only decoder); raises RecordError
        for anything else."""
        try:
            data = safejson.loads(text, max_bytes=MAX_BOOT_BYTES)
        except safejson.BadJson as exc:
            raise RecordError(f"{envvars.BOOT}: {exc}; launch tasks through FlowApp "
                              "and run the same flow-sdk version on the client and the "
                              "nodes") from None
        if not isinstance(data, dict) or sorted(data) != sorted(_FIELDS):
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise RecordError(f"{envvars.BOOT}: expected the fields {sorted(_FIELDS)}, got "
                              f"{got}; run the same flow-sdk version on the client and the nodes")
        if not all(isinstance(data[k], str) for k in ("task_id", "provider", "secret")) \
                or not isinstance(data["provider_config"], dict) or data["role"] not in ROLES:
            raise RecordError(f"{envvars.BOOT}: task_id, provider and secret must be strings, "
                              f"provider_config an object and role one of {list(ROLES)}")
        return cls(data["task_id"], data["provider"], data["provider_config"], data["secret"],
                   data["role"])


def node_boot(environ: Mapping[str, str] = os.environ) -> tuple[BootConfig, str, str]:
    """On a node: its boot configuration (from ``FLOW_BOOT``, or the file ``FLOW_BOOT_FILE``
    names) without the secret of ``FLOW_SECRET_FILE``, its instance id and its address."""
    file = environ.get(envvars.BOOT_FILE)
    if file:
        text = Path(file).read_text(encoding="utf-8")
    elif envvars.BOOT in environ:
        text = environ[envvars.BOOT]
    else:
        raise RecordError(f"neither {envvars.BOOT} nor {envvars.BOOT_FILE} is set: node agents "
                          "are started by a provider")
    return BootConfig.decode(text), environ[envvars.INSTANCE_ID], environ[envvars.NODE_ADDRESS]


def take_node_boot(environ: MutableMapping[str, str] = os.environ
                   ) -> tuple[BootConfig, str, str]:
    """``node_boot`` with the secret (``FLOW_SECRET_FILE``'s where it names one), then the
    secret's traces gone from this process: ``FLOW_BOOT``, ``FLOW_BOOT_FILE`` and
    ``FLOW_SECRET_FILE`` leave its environment (no worker, session or helper inherits them)
    and the files are removed once read. Raises RecordError when no secret came."""
    boot, instance_id, address = node_boot(environ)
    secret_file = environ.get(envvars.SECRET_FILE)
    if secret_file:
        try:
            boot = replace(boot, secret=Path(secret_file).read_bytes().decode("ascii").strip())
        except UnicodeDecodeError:
            raise RecordError(f"{envvars.SECRET_FILE}: the secret is not hex text; launch tasks "
                              "through FlowApp") from None
    for name in (envvars.BOOT_FILE, envvars.SECRET_FILE):
        file = environ.pop(name, None)
        if file:
            Path(file).unlink(missing_ok=True)
    environ.pop(envvars.BOOT, None)
    if not boot.secret:
        raise RecordError(f"the node's boot configuration carries no secret, and no "
                          f"{envvars.SECRET_FILE} names one: node agents are started by a provider")
    return boot, instance_id, address
