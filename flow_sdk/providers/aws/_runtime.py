"""The node runtime: how the aws provider's instances become running nodes, and how they are
reached. ``AwsProvider`` launches, lists and terminates EC2 instances the same way whatever it
holds; the runtime is the one part that differs, and the provider never asks which it holds.

``Ec2Runtime`` is real EC2: the user-data starts each node's agent on the instance, nodes are
reached at their private addresses, and nothing runs on this machine. Another runtime is
handed to ``AwsProvider`` by whoever builds it (a provider registered under its own name that
subclasses ``AwsProvider``); it gets each gang's typed boot (``NodeBoot``) with the rendered
user-data, and runs the user-data as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from flow_sdk.providers.aws._userdata import BootstrapInputs
from flow_sdk.spec import TaskSpec


@dataclass(frozen=True)
class NodeBoot:
    """What the nodes of one gang boot with: the typed inputs their user-data was rendered
    from, where they were launched, and the rendered user-data itself (what EC2 runs)."""

    task_id: str
    region: str  # the launch region of the gang
    attempt: int  # the gang's launch attempt
    spec: TaskSpec
    inputs: BootstrapInputs  # boot config, SDK wheel, image, mount paths, volume mounts
    user_data: str


class NodeRuntime(Protocol):
    """Start, reach and stop the nodes of EC2 instances the provider launched."""

    def address(self, private_ip: str) -> str:
        """Where the other nodes reach the instance with VPC address ``private_ip``."""
        ...

    def start(self, boot: NodeBoot, nodes: Sequence[tuple[str, str]]) -> None:
        """Make ``(instance_id, address)`` nodes run ``boot.user_data``. Raises OSError when a
        node cannot be started (the provider then terminates the instances)."""
        ...

    def stop(self, task_id: str, instance_ids: Sequence[str] | None = None) -> list[int]:
        """Stop what runs here for the task's nodes (the named ones, or all); returns the
        pids of this machine's processes it stopped. Idempotent."""
        ...

    def tasks(self) -> list[str]:
        """Tasks with nodes run by this machine (``gc`` stops those of ended tasks)."""
        ...

    def node_config(self) -> dict[str, Any]:
        """Keys added to the provider config the nodes boot with, from which the provider
        that the nodes rebuild (by its registered name) rebuilds this runtime; the aws
        provider passes them on without reading them."""
        ...


class Ec2Runtime:
    """Real EC2: each instance runs its user-data (the bootstrap starts the agent)."""

    def address(self, private_ip: str) -> str:
        return private_ip

    def start(self, boot: NodeBoot, nodes: Sequence[tuple[str, str]]) -> None:
        return None  # EC2 ran the user-data when the instances started

    def stop(self, task_id: str, instance_ids: Sequence[str] | None = None) -> list[int]:
        return []  # terminating the instances stopped everything on them

    def tasks(self) -> list[str]:
        return []

    def node_config(self) -> dict[str, Any]:
        return {}
