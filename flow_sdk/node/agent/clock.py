"""The agents' availability clock: it starts when the first agent of the task is up.

A node's boot (install, image pull, volumes) is bounded by the task's ``boot_timeout_s``
(the bootstrap powers a node off that is not up in time); the wait for the other nodes is
bounded by ``availability_timeout_s``, counted from the earliest agent-up record in the store,
so a node that booted minutes after its peers still gets what is left of the same clock and
not a clock of its own. A later generation waits for replacement nodes, which boot first: it
gets both clocks, from its start.
"""

from __future__ import annotations

from flow_sdk import wire
from flow_sdk.errors import SignatureError
from flow_sdk.wire import AgentUp
from flow_sdk.wire.signing import SignedStore
from flow_sdk.spec import TaskSpec

# A node that arrives just before the deadline still gets this long (at most the availability
# timeout itself) to connect to the leader's store and pass the start barrier.
JOIN_GRACE_S = 10.0


def mark_up(store: SignedStore, task_id: str, instance_id: str, now: float) -> None:
    """Record that this node's agent is up (once; a restarted agent keeps its first time)."""
    store.put_record_if_absent(wire.agent_up_key(task_id, instance_id),
                               AgentUp(instance_id, now))


def first_up(store: SignedStore, task_id: str, default: float) -> float:
    """The earliest agent-up time of the task; ``default`` when there is none. Records
    without the task's MAC are left out."""
    times = []
    for key in store.list(wire.agents_up_prefix(task_id)):
        try:
            raw = store.get_record(key)
        except SignatureError:
            continue  # a forged record cannot move the clock
        if raw is not None:
            times.append(AgentUp.from_json(raw).up_at)
    return min(times, default=default)


def availability_deadline(store: SignedStore, task_id: str, spec: TaskSpec, generation: int,
                          now: float) -> float:
    """When (epoch seconds) the wait for the other nodes of ``generation`` ends."""
    if generation:
        return now + spec.boot_timeout_s + spec.availability_timeout_s
    return first_up(store, task_id, now) + spec.availability_timeout_s


def remaining(deadline: float, now: float, floor: float = 0.0) -> float:
    """Seconds of the availability clock left at ``now``, at least ``floor``."""
    return max(deadline - now, floor)
