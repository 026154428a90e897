"""The node runtime: how the aws provider's instances become running nodes, and how they are
reached. ``AwsProvider`` launches, lists and terminates EC2 instances the same way whatever it
holds; the runtime is the one part that differs.

``Ec2Runtime`` is real EC2: the user-data starts each node's agent on the instance, nodes are
reached at their private addresses, and nothing runs on this machine. Another runtime (built
by ``AwsConfig.node_runtime``) can play the instances some other way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from flow_sdk.errors import FieldProblem
from flow_sdk.providers.aws._imds import IMDS_ENDPOINT
from flow_sdk.spec import TaskSpec


class NodeRuntime(Protocol):
    """Start and reach the nodes of EC2 instances the provider launched."""

    def check(self, spec: TaskSpec) -> list[FieldProblem]:
        """What this runtime cannot do for ``spec`` (found before anything is launched)."""
        ...

    def python(self) -> str | None:
        """The Python ``major.minor`` the nodes run whatever the image, or None when it is
        the image's (provider_config image_python, or the default image's)."""
        ...

    def address(self, private_ip: str) -> str:
        """Where the other nodes reach the instance with VPC address ``private_ip``."""
        ...

    def rendezvous_ports(self) -> tuple[int, int] | None:
        """(agent store port, MASTER_PORT) for a new task; None when each node owns its
        ports (the provider's defaults apply)."""
        ...

    def start(self, task_id: str, nodes: Sequence[tuple[str, str]], user_data: str) -> None:
        """Make ``(instance_id, address)`` nodes run what ``user_data`` starts. Raises OSError
        when a node cannot be started (the provider then terminates the instances)."""
        ...

    def stop(self, task_id: str, instance_ids: Sequence[str] | None = None) -> list[int]:
        """Stop what runs here for the task's nodes (the named ones, or all); returns the
        pids of this machine's processes it stopped. Idempotent."""
        ...

    def live_pids(self, task_id: str) -> list[int]:
        """Processes on this machine that still run nodes of the task."""
        ...

    def tasks(self) -> list[str]:
        """Tasks with nodes run by this machine (``gc`` checks each of them)."""
        ...

    def interruption_endpoint(self) -> str | None:
        """The metadata service a node reads its interruption notices from, or None."""
        ...

    def ssh_unavailable(self, task_id: str, instance_id: str) -> str | None:
        """Why the node cannot be reached over SSH, or None when it can."""
        ...


class Ec2Runtime:
    """Real EC2: each instance runs its user-data (the bootstrap starts the agent)."""

    def check(self, spec: TaskSpec) -> list[FieldProblem]:
        return []

    def python(self) -> str | None:
        return None

    def address(self, private_ip: str) -> str:
        return private_ip

    def rendezvous_ports(self) -> tuple[int, int] | None:
        return None

    def start(self, task_id: str, nodes: Sequence[tuple[str, str]], user_data: str) -> None:
        return None  # EC2 ran the user-data when the instances started

    def stop(self, task_id: str, instance_ids: Sequence[str] | None = None) -> list[int]:
        return []  # terminating the instances stopped everything on them

    def live_pids(self, task_id: str) -> list[int]:
        return []

    def tasks(self) -> list[str]:
        return []

    def interruption_endpoint(self) -> str | None:
        return IMDS_ENDPOINT

    def ssh_unavailable(self, task_id: str, instance_id: str) -> str | None:
        return None
