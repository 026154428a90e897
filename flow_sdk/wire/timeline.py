"""When each node of a task reached each step of its launch and run: the timeline records.

Every node's agent keeps one signed record under ``timeline_key`` with the first time
(epoch seconds, the node's clock) it saw each phase; the client adds ``requested`` (the task
record) and ``instance_running`` (the provider's instance list) when it reads them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from flow_sdk.errors import RecordError
from flow_sdk.wire.keys import task_prefix
from flow_sdk.wire.records import _fields_of

# In the order a node goes through them; ``generation_<n>`` (n >= 1, a restart) come
# between ``first_worker_line`` and ``end``. Generation 0 starts at ``barrier_released``.
PHASES: tuple[str, ...] = (
    "requested",  # the client spawned the task
    "instance_running",  # the provider reports the instance launched
    "boot_started",  # the bootstrap began (nodes that boot through user-data only)
    "code_installed",  # the bootstrap installed the SDK wheel
    "agent_up",
    "joined",  # the rendezvous knows this node's place in the gang
    "barrier_released",  # every node passed the start barrier: generation 0 starts
    "first_worker_line",
    "end",
)
_GENERATION = re.compile(r"generation_([1-9][0-9]{0,5})")
_END_INDEX = PHASES.index("end")


def generation_phase(number: int) -> str:
    """The phase name of restart generation ``number`` (1 and up)."""
    if number < 1:
        raise ValueError(f"generation {number}: generation 0 starts at barrier_released")
    return f"generation_{number}"


def is_phase(name: str) -> bool:
    """Whether ``name`` is one of ``PHASES`` or ``generation_<n>`` with n >= 1."""
    return name in PHASES or _GENERATION.fullmatch(name) is not None


def phase_order(name: str) -> tuple[int, int]:
    """A sort key that puts phases in the order a node goes through them."""
    match = _GENERATION.fullmatch(name)
    if match is not None:
        return (_END_INDEX, int(match[1]))
    if name == "end":
        return (_END_INDEX + 1, 0)
    return (PHASES.index(name), 0)


def timeline_prefix(task_id: str) -> str:
    return f"{task_prefix(task_id)}timeline/"


def timeline_key(task_id: str, instance_id: str) -> str:
    """One node's timeline record, written by its agent."""
    return f"{timeline_prefix(task_id)}{instance_id}.json"


@dataclass(frozen=True)
class NodeTimeline:
    """The first time (epoch seconds) one node reached each phase; ``node`` is its rank in
    the gang once the rendezvous gave it one."""

    instance_id: str
    node: int | None
    phases: dict[str, float]

    def ordered(self) -> list[tuple[str, float]]:
        """``(phase, time)`` in the order a node goes through the phases."""
        return sorted(self.phases.items(), key=lambda item: phase_order(item[0]))

    @classmethod
    def from_json(cls, data: bytes) -> NodeTimeline:
        raw = _fields_of(cls, data)
        instance_id, node = raw["instance_id"], raw["node"]
        if not isinstance(instance_id, str) or not instance_id:
            raise RecordError(f"NodeTimeline: instance_id is {instance_id!r}, not a string")
        if node is not None and (isinstance(node, bool) or not isinstance(node, int)
                                 or node < 0):
            raise RecordError(f"NodeTimeline: node is {node!r}, not a rank")
        return cls(instance_id, node, _phases(raw["phases"]))


def _phases(raw: Any) -> dict[str, float]:
    """The phases of a record, checked: known names, finite numbers."""
    if not isinstance(raw, dict):
        raise RecordError(f"NodeTimeline: phases is a {type(raw).__name__}, not an object")
    phases: dict[str, float] = {}
    for name, at in raw.items():
        if not is_phase(name):
            raise RecordError(f"NodeTimeline: unknown phase {name!r}, not one of "
                              f"{list(PHASES)} or generation_<n>; run the same flow-sdk "
                              "version on the client and the nodes")
        if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
            raise RecordError(f"NodeTimeline: phase {name!r} is at {at!r}, not a time in "
                              "seconds")
        phases[name] = float(at)
    return phases
