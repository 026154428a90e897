"""The records that the client and the node agents exchange through a provider's store.

The JSON shapes and the enums they carry; each reader raises ``RecordError`` for a shape it
does not know, so a client and nodes of different versions fail loudly.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from flow_sdk.errors import RecordError
import flow_sdk.wire.safejson as safejson

MAX_RECORD_BYTES = 16 << 20  # no record of ours comes near it


class TaskStatus(str, Enum):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL

    def __str__(self) -> str:
        return self.value


_TERMINAL = frozenset({TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED,
                       TaskStatus.TIMED_OUT})
TERMINAL_STATUSES: tuple[str, ...] = tuple(s.value for s in TaskStatus if s.is_terminal)


class NodePhase(str, Enum):
    """Where a node is in its task, as its agent writes it into its ``NodeRecord``. DONE,
    FAILED and RESTARTING are also how a generation ended on the node."""

    RENDEZVOUS = "rendezvous"  # discovered its rank, waiting for the others
    RUNNING = "running"  # its workers run the function
    RESTARTING = "restarting"  # a failed generation restarts (``max_restarts``)
    DONE = "done"  # its workers succeeded
    FAILED = "failed"  # the task failed and this node stopped
    CANCELLED = "cancelled"  # the task was cancelled and this node stopped

    def __str__(self) -> str:
        return self.value


NODE_PHASES: tuple[str, ...] = tuple(p.value for p in NodePhase)
# What a running node's workers are doing, as its agent sees it (``NodeRecord.activity``), in
# the order they go through it: each worker writes the stage it reached into a file the
# agent reads; the node shows its least advanced worker's.
WORKER_ACTIVITIES: tuple[str, ...] = ("starting", "importing your code", "running your code")
FAILURE_LABELS = ("user", "infra", "sdk")


class StreamKind(str, Enum):
    """The kinds of log stream of a task: a worker's (``node-i.rank-r``), an agent's
    (``agent.<instance id>``) and a node's raw boot output (``boot.<instance id>``)."""

    NODE = "node"
    AGENT = "agent"
    BOOT = "boot"

    def __str__(self) -> str:
        return self.value


STREAM_KINDS: tuple[str, ...] = tuple(k.value for k in StreamKind)


def to_json(record: Any) -> bytes:
    return json.dumps(asdict(record), sort_keys=True).encode()


def _fields_of(cls: type[Any], data: bytes) -> dict[str, Any]:
    """The JSON object in ``data`` as keyword arguments of the dataclass ``cls``; raises
    RecordError when it is not JSON or its keys are not ``cls``'s fields."""
    what = cls.__name__
    try:
        raw = safejson.loads(data, max_bytes=MAX_RECORD_BYTES)
    except safejson.BadJson as exc:
        raise RecordError(f"{what}: {exc}; run the same flow-sdk version on the client and "
                          "the nodes") from None
    if not isinstance(raw, dict):
        raise RecordError(f"{what}: expected a JSON object, got {type(raw).__name__}")
    raw.pop("mac", None)  # flow_sdk.wire.signing's MAC, checked before the record is parsed
    known = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls)
                if f.default is MISSING and f.default_factory is MISSING}
    unknown, missing = sorted(set(raw) - known), sorted(required - set(raw))
    if unknown or missing:
        raise RecordError(f"{what}: unknown fields {unknown}, missing fields {missing}; run "
                          "the same flow-sdk version on the client and the nodes")
    return raw


def _one_of(what: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise RecordError(f"{what} is {value!r}, not one of {list(allowed)}; run the same "
                          "flow-sdk version on the client and the nodes")
    return str(value)


@dataclass(frozen=True)
class TaskRecord:
    """Written by the client at spawn; read by every node agent."""

    task_id: str
    spec: dict[str, Any]  # TaskSpec.model_dump(mode="json")
    payload_digest: str  # the call (or, with ``code_digest``, its arguments)
    created_at: float
    rdzv_port: int
    master_port: int
    python: str = ""  # the caller's Python major.minor; the nodes refuse another one
    code_digest: str = ""  # the call's code, stored apart from its arguments ("": together)
    # The call's code imports torch: a node that starts several workers, or may restart them,
    # imports it once and forks them (``flow_sdk.node.agent.spawn.Template``).
    imports_torch: bool = False

    @property
    def digests(self) -> tuple[str, ...]:
        """Every payload the task's nodes read."""
        return (self.payload_digest, self.code_digest) if self.code_digest else (
            self.payload_digest,)

    @classmethod
    def from_json(cls, data: bytes) -> TaskRecord:
        raw = _fields_of(cls, data)
        if not isinstance(raw.get("imports_torch", False), bool):
            raise RecordError(f"TaskRecord: imports_torch is {raw['imports_torch']!r}, not true "
                              "or false; run the same flow-sdk version on the client and the "
                              "nodes")
        return cls(**raw)


@dataclass(frozen=True)
class LaunchedNode:
    instance_id: str
    instance_type: str
    market: str
    usd_per_hour: float
    zone: str | None = None


@dataclass(frozen=True)
class LaunchRecord:
    """What the provider started for a task, with its prices; written by the client."""

    launched_at: float
    nodes: list[LaunchedNode]

    @classmethod
    def from_json(cls, data: bytes) -> LaunchRecord:
        raw = _fields_of(cls, data)
        return cls(raw["launched_at"], [LaunchedNode(**n) for n in raw["nodes"]])


LEASE_STATES = ("launching", "launched", "rolled-back")
LEASE_MAX_TTL_S = 3600.0  # a lease claiming a longer life (or a future renewal) is stale


@dataclass(frozen=True)
class LaunchLease:
    """What the launching client says about its launch while it runs: ``launching``, renewed
    every few seconds; then ``launched`` (the gang started) or ``rolled-back`` (the launch
    failed or was interrupted, and what it started was removed). A ``launching`` lease that
    was not renewed within ``ttl_s`` means the client died mid-launch."""

    state: str  # one of LEASE_STATES
    renewed_at: float  # epoch seconds, the client's clock
    ttl_s: float
    holder: str  # "<host>:<pid>" of the launching process

    def stale(self, now: float) -> bool:
        """Whether a ``launching`` lease is past its life (a client killed mid-launch)."""
        ttl = min(self.ttl_s, LEASE_MAX_TTL_S)
        return now > self.renewed_at + ttl or self.renewed_at > now + LEASE_MAX_TTL_S

    @classmethod
    def from_json(cls, data: bytes) -> LaunchLease:
        raw = _fields_of(cls, data)
        _one_of("LaunchLease.state", raw["state"], LEASE_STATES)
        for name in ("renewed_at", "ttl_s"):
            if isinstance(raw[name], bool) or not isinstance(raw[name], (int, float)):
                raise RecordError(f"LaunchLease.{name} is {raw[name]!r}, not a number")
        return cls(**raw)


@dataclass(frozen=True)
class AgentUp:
    """When a node's agent came up (epoch seconds, the node's clock)."""

    instance_id: str
    up_at: float

    @classmethod
    def from_json(cls, data: bytes) -> AgentUp:
        return cls(**_fields_of(cls, data))


@dataclass(frozen=True)
class GangMember:
    instance_id: str
    address: str  # the private address the other nodes reach it at


@dataclass(frozen=True)
class MembershipRecord:
    """Every node of one generation with its address, from whoever started the nodes (it
    holds them all), so the nodes need not ask the provider who their peers are."""

    generation: int
    members: list[GangMember]
    written_at: float

    @classmethod
    def from_json(cls, data: bytes) -> MembershipRecord:
        """The record in ``data``; raises RecordError for an unknown shape."""
        raw = _fields_of(cls, data)
        members = raw["members"]
        names = {f.name for f in fields(GangMember)}
        if not isinstance(members, list) or not all(
                isinstance(m, dict) and set(m) == names
                and all(isinstance(v, str) for v in m.values()) for m in members):
            raise RecordError("MembershipRecord.members must be a list of {instance_id, "
                              "address} strings; run the same flow-sdk version on the client "
                              "and the nodes")
        return cls(int(raw["generation"]), [GangMember(**m) for m in members],
                   float(raw["written_at"]))


@dataclass(frozen=True)
class NodeRecord:
    """A node's place in the task, written by its agent after discovery."""

    node: int
    instance_id: str
    address: str
    phase: NodePhase
    updated_at: float
    workers: int = 0
    activity: str = ""  # one of WORKER_ACTIVITIES while it runs them; "" before, or unknown

    @classmethod
    def from_json(cls, data: bytes) -> NodeRecord:
        """The record in ``data``; raises RecordError for an unknown shape, phase or
        activity."""
        raw = _fields_of(cls, data)
        raw["phase"] = NodePhase(_one_of("NodeRecord.phase", raw["phase"], NODE_PHASES))
        if raw.get("activity", "") != "":
            _one_of("NodeRecord.activity", raw["activity"], WORKER_ACTIVITIES)
        return cls(**raw)


@dataclass(frozen=True)
class Outcome:
    """The terminal state of a task; the first writer wins (``put_if_absent``)."""

    status: str  # a terminal TaskStatus value (TERMINAL_STATUSES)
    message: str
    finished_at: float
    node: int | None = None
    rank: int | None = None
    exit_code: int | None = None
    signal_name: str | None = None
    log_tail: list[str] = field(default_factory=list)
    has_error_payload: bool = False
    # Whose fault a failure was: "user" (an exception in user code), "infra" (a lost node, the
    # OOM killer, a full disk, a signal from outside, a boot failure) or "sdk" (flow-sdk's own).
    label: str | None = None
    consequences: list[str] = field(default_factory=list)  # later failures, in time order

    @classmethod
    def from_json(cls, data: bytes) -> Outcome:
        """The outcome in ``data``; raises RecordError for an unknown shape or status."""
        raw = _fields_of(cls, data)
        _one_of("Outcome.status", raw["status"], TERMINAL_STATUSES)
        if raw.get("label") is not None:
            _one_of("Outcome.label", raw["label"], FAILURE_LABELS)
        return cls(**raw)
