"""What a provider ships to its nodes before their agent can start: the wheels, by digest.

A node runs the caller's own code, never what a package index serves under a name: the SDK's
wheel (``sdkwheel.build``) and, for a provider plugged in from another distribution (the
``flow_sdk.providers`` entry-point group), that distribution's wheel beside it
(``sdkwheel.build_distribution``), so the provider's node-side modules import on a node that
has nothing of either installed. The agent rebuilds its provider by name on the node, from the
entry points the plug-in's wheel carries.

``ship_wheels`` stores them content-addressed in the provider's object store
(``wire.code_key``); the caller's Python ``major.minor`` comes with them, since the nodes must
run the same (the wheels require it, and the task's pickles need it). A node's bootstrap fetches
each wheel, checks its SHA-256 before it installs anything (``sdkwheel.verify``, or the same
check in the bootstrap's own language), and installs them: these are pure-Python wheels, so
unpacking them into a folder on the interpreter's path installs them, as pip does.
"""

from __future__ import annotations

from dataclasses import dataclass

from flow_sdk import sdkwheel, wire
from flow_sdk.providers import plugin_source
from flow_sdk.providers.base import ObjectStore


@dataclass(frozen=True)
class ShippedWheel:
    """A wheel in the task's object store: its key, SHA-256 and file name, and the caller's
    Python ``major.minor`` the nodes must run."""

    key: str
    sha256: str
    filename: str
    python: str


def ship(store: ObjectStore, wheel: sdkwheel.Wheel) -> ShippedWheel:
    """Store ``wheel`` under its digest (once: the same bytes are never written twice)."""
    key = wire.code_key(wheel.sha256)
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
