"""What a pool's client and its nodes exchange: the pool's keys and records.

A pool is a named set of warm nodes whose daemons run the pool's tasks one after another. Its
records live under the pool's own folder of the store (``tasks/<pool id>/``), and the tasks
that run on it have ids that start with the pool's id (``<pool id>.<task>``), so everything of
a pool and its tasks shares one prefix (what a per-pool cloud role is scoped to). Every pool
record is sealed with the pool's secret; an assignment carries the task's own secret sealed
under it (``signing.seal_secret``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flow_sdk.wire.keys import task_prefix
from flow_sdk.wire.records import GangMember, _fields_of, _one_of

POOL_STATES = ("starting", "up")  # "starting": ``pool up`` has not finished
MEMBER_STATES = ("idle", "busy", "standby", "stopping")
ASSIGNMENT_ROLES = ("run", "standby")  # run the task now, or stand by as its spare
TASK_SEPARATOR = "."  # between the pool's id and the task's own part in a pool task's id


def pool_key(pool_id: str) -> str:
    return f"{task_prefix(pool_id)}pool.json"


def member_key(pool_id: str, instance_id: str) -> str:
    """Written by a pool node's daemon: its state, for the client and ``flow pool list``."""
    return f"{task_prefix(pool_id)}members/{instance_id}.json"


def members_prefix(pool_id: str) -> str:
    return f"{task_prefix(pool_id)}members/"


def sequence_key(pool_id: str, number: int) -> str:
    """Claimed (put_if_absent) by the client that launches the pool's ``number``-th task, so
    every node runs the pool's tasks in one order."""
    return f"{task_prefix(pool_id)}sequence/{number:08d}"


def sequence_prefix(pool_id: str) -> str:
    return f"{task_prefix(pool_id)}sequence/"


def sequence_number(pool_id: str, key: str) -> int | None:
    """The number a key listed under ``sequence_prefix`` claims; None for any key
    ``sequence_key`` does not write (junk under the prefix is no claim)."""
    digits = key.removeprefix(sequence_prefix(pool_id))
    if not (8 <= len(digits) <= 18 and digits.isascii() and digits.isdigit()):
        return None
    number = int(digits)
    return number if sequence_key(pool_id, number) == key else None


def assignment_key(pool_id: str, instance_id: str, number: int) -> str:
    return f"{task_prefix(pool_id)}assign/{instance_id}/{number:08d}.json"


def assignments_prefix(pool_id: str, instance_id: str) -> str:
    return f"{task_prefix(pool_id)}assign/{instance_id}/"


def standby_key(task_id: str) -> str:
    """A pool task's spares, sealed with the task's secret by its client: the pool nodes that
    stand by to take a lost node's place (``StandbyRecord``)."""
    return f"{task_prefix(task_id)}standby.json"


def left_key(task_id: str, instance_id: str) -> str:
    """Written (sealed with the task's secret) by a pool node's daemon when the task's agent
    on it exited before the task ended: the node left the task, though it still runs."""
    return f"{task_prefix(task_id)}left/{instance_id}"


def left_prefix(task_id: str) -> str:
    return f"{task_prefix(task_id)}left/"


def pool_of_task(task_id: str) -> str:
    """The pool id a pool task's id starts with; "" for a task on nodes of its own."""
    head, sep, _ = task_id.partition(TASK_SEPARATOR)
    return head if sep else ""


@dataclass(frozen=True)
class PoolRecord:
    """Written by the client at ``pool up``: the pool's shape, read by its nodes and clients."""

    name: str
    pool_id: str
    spec: dict[str, Any]  # the pool's TaskSpec (provider, gpu, nodes, image, volumes, ...)
    size: int  # nodes a task may use
    spares: int  # nodes beyond ``size`` that stand by
    idle_stop_s: float  # a node with no task for this long powers off
    created_at: float
    state: str  # POOL_STATES
    sdk: str  # the digest of the SDK the nodes run; a client with another one cannot use it
    python: str  # the nodes' Python major.minor

    @classmethod
    def from_json(cls, data: bytes) -> PoolRecord:
        raw = _fields_of(cls, data)
        _one_of("PoolRecord.state", raw["state"], POOL_STATES)
        return cls(**raw)


@dataclass(frozen=True)
class MemberRecord:
    """A pool node as its daemon last wrote it."""

    instance_id: str
    address: str
    state: str  # MEMBER_STATES
    task_id: str  # the task it runs or stands by for; "" when idle
    idle_since: float  # when its last task ended (or it came up)
    stop_at: float | None  # when its idle timer powers it off; None while a task runs
    updated_at: float
    template: str  # how it starts workers: "warm (torch 2.x imported)" or "cold: <why>"
    agent_pid: int = 0  # the running task's agent, on this node; 0 when none

    @classmethod
    def from_json(cls, data: bytes) -> MemberRecord:
        raw = _fields_of(cls, data)
        _one_of("MemberRecord.state", raw["state"], MEMBER_STATES)
        return cls(**raw)


@dataclass(frozen=True)
class SequenceClaim:
    task_id: str

    @classmethod
    def from_json(cls, data: bytes) -> SequenceClaim:
        return cls(**_fields_of(cls, data))


@dataclass(frozen=True)
class Assignment:
    """One task for one pool node, in the pool's order: run it now, or stand by as its spare
    until a later generation's membership names this node."""

    number: int
    task_id: str
    role: str  # ASSIGNMENT_ROLES
    sealed_secret: str  # the task's secret, sealed under the pool's (signing.seal_secret)
    created_at: float

    @classmethod
    def from_json(cls, data: bytes) -> Assignment:
        raw = _fields_of(cls, data)
        _one_of("Assignment.role", raw["role"], ASSIGNMENT_ROLES)
        return cls(**raw)


@dataclass(frozen=True)
class StandbyRecord:
    """The spares of a pool task, in the order a decider takes them."""

    pool_id: str
    spares: list[GangMember]

    @classmethod
    def from_json(cls, data: bytes) -> StandbyRecord:
        raw = _fields_of(cls, data)
        return cls(raw["pool_id"], [GangMember(**m) for m in raw["spares"]])
