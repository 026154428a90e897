"""How a node starts: one typed description (``NodeLaunch``), built in one place from a launch
(``node_launch``), that every provider renders into its own way of starting a node: the local
provider's agent and keeper processes (``local/_node.py``), EC2 user-data
(``aws/_userdata.py``), a plug-in's own bootstrap (``tests/plugin_provider``).

A node learns the task's spec once, from the signed task record in the store. What it must know
before it can read that record is all here:

- the boot configuration (``wire.BootConfig``): the task's id, the provider by name and its
  config (so the agent can rebuild it and reach the store), the node module to run, and the
  task's secret (which checks the record): in a 0600 file, never in argv or a readable
  environment;
- the node's own instance id and address (``agent_env``; where only the node knows them, as on
  a cloud, its bootstrap sets the same variables, declared in ``wire.envvars``);
- the wheels to install (the SDK's, and a plug-in provider's own), by digest, and the caller's
  Python ``major.minor``, which the node's interpreter must match;
- the boot timeout (the agent must be up within it) and the runtime cap still left, from which
  each layer that starts nodes takes its backstop (``wire.runtimecap``): it holds even when no
  agent runs;
- what a bootstrap prepares before the agent runs: the container image to run it in, the
  paths of the task's volumes and mounts (passed into that container), whether it needs the
  GPUs, and the internode interconnect (EFA's environment on AWS).

The wheels: a node runs the caller's own code, never what a package index serves under a name:
the SDK's wheel (``sdkwheel.build``) and, for a provider plugged in from another distribution
(the ``flow_sdk.providers`` entry-point group), that distribution's wheel beside it
(``sdkwheel.build_distribution``), so the provider's node-side modules import on a node that has
nothing of either installed; the agent rebuilds its provider by name on the node, from the entry
points the plug-in's wheel carries. ``ship_wheels`` stores them content-addressed in the
provider's object store (``wire.code_key``). A node's bootstrap fetches each wheel, checks its
SHA-256 before it installs anything (``sdkwheel.verify``, or the same check in the bootstrap's
own language), and installs them: these are pure-Python wheels, so unpacking them into a folder
on the interpreter's path installs them, as pip does. A provider whose nodes are processes of
the caller's own machine (``local``) ships none: they run the caller's installed SDK.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from flow_sdk import wire
from flow_sdk.providers import sdkwheel
from flow_sdk.providers import plugin_source
from flow_sdk.providers.base import LaunchRequest, ObjectStore
from flow_sdk.wire import BootConfig, envvars
from flow_sdk.wire.runtimecap import Layer


@dataclass(frozen=True)
class ShippedWheel:
    """A wheel in the task's object store: its key, SHA-256 and file name, and the caller's
    Python ``major.minor`` the nodes must run."""

    key: str
    sha256: str
    filename: str
    python: str


@dataclass(frozen=True)
class NodeLaunch:
    """How each node of a launch starts (see the module docstring)."""

    boot: BootConfig
    wheels: tuple[ShippedWheel, ...]  # () where nodes run the caller's installed SDK
    python: str  # the caller's major.minor
    boot_timeout_s: float
    max_run_time_hours: float | None  # what is left of the runtime cap when the node starts
    image: str | None = None  # run the agent inside this container image
    mount_paths: tuple[str, ...] = ()  # the task's volume and mount paths
    gpus: bool = False  # the task asked for GPUs
    interconnect: str | None = None  # the task's internode_interconnect, as it gave it

    @property
    def module(self) -> str:
        """What the node runs: ``python -m MODULE``."""
        return self.boot.node_module

    def boot_text(self) -> str:
        """The boot configuration with the secret: the content of the node's 0600 boot file
        (``FLOW_BOOT_FILE``)."""
        return self.boot.encode()

    def boot_without_secret(self) -> BootConfig:
        """The boot configuration for where it is readable (EC2 user-data): the node reads
        the secret from a 0600 file of its own (``FLOW_SECRET_FILE``)."""
        return replace(self.boot, secret="")

    def agent_env(self, instance_id: str, address: str, boot_file: Path) -> dict[str, str]:
        """The variables a node's agent starts with: its 0600 boot file (which the agent
        reads and removes), its instance id and its address."""
        return {envvars.BOOT_FILE: str(boot_file), envvars.INSTANCE_ID: instance_id,
                envvars.NODE_ADDRESS: address}

    def backstop(self, layer: Layer, start: float) -> float | None:
        """When ``layer`` (one of ``wire.runtimecap``'s) stops a node started at ``start``
        (epoch seconds), past what is left of the cap and the layer's grace; None without a
        cap, or for a pool's node (its daemon has none: each task on it carries its own)."""
        if self.boot.role != "task":
            return None
        return layer.deadline(start, self.max_run_time_hours)


def node_launch(request: LaunchRequest, wheels: tuple[ShippedWheel, ...] = (), *,
                max_run_time_hours: float | None = None) -> NodeLaunch:
    """How the nodes of ``request`` start: with ``wheels`` (``ship_wheels``; none where they
    run the caller's installed SDK) and the task's runtime cap, or what is left of it for a
    node that joins later (``max_run_time_hours``)."""
    spec = request.spec
    return NodeLaunch(request.boot, wheels,
                      wheels[0].python if wheels else sdkwheel.python_version(),
                      spec.boot_timeout_s, spec.max_run_time_hours
                      if max_run_time_hours is None else max_run_time_hours,
                      image=spec.image, mount_paths=tuple(sorted([*spec.volumes, *spec.mounts])),
                      gpus=spec.gpu is not None, interconnect=spec.internode_interconnect)


def ship(store: ObjectStore, wheel: sdkwheel.Wheel) -> ShippedWheel:
    """Store ``wheel`` under its digest (once: the same bytes are never written, nor sent to
    a store elsewhere, twice)."""
    key = wire.code_key(wheel.sha256)
    if not store.exists(key):
        store.put_if_absent(key, wheel.data)
    return ShippedWheel(key, wheel.sha256, wheel.filename, wheel.python)


def node_wheels(provider_name: str) -> list[sdkwheel.Wheel]:
    """The wheels the nodes of provider ``provider_name`` install: the SDK's, then (for a
    plug-in) its distribution's."""
    wheels = [sdkwheel.build()]
    source = plugin_source(provider_name)
    if source is not None:
        wheels.append(sdkwheel.build_distribution(*source))
    return wheels


def ship_wheels(store: ObjectStore, provider_name: str) -> tuple[ShippedWheel, ...]:
    """``node_wheels``, stored in ``store``: what a launch passes its nodes' bootstrap."""
    return tuple(ship(store, wheel) for wheel in node_wheels(provider_name))
