"""The records that the client and the node agents exchange through a provider's store.

One place for the key layout and the JSON shapes, so ``app``/``task`` (client side) and
``agent`` (node side) cannot drift apart.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

from flow_sdk.errors import RecordError


# The agent lists its workers' process groups in this file of its working directory, so a
# provider whose nodes are local processes can stop everything a node started.
WORKER_PGIDS_FILE = "worker-pgids"
# Names a 0600 file holding FLOW_BOOT (it carries the task's secret), for providers that start
# agents as local processes: the secret stays out of argv and environment dumps.
BOOT_FILE_ENV = "FLOW_BOOT_FILE"


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

    def __str__(self) -> str:
        return self.value


NODE_PHASES: tuple[str, ...] = tuple(p.value for p in NodePhase)


class StreamKind(str, Enum):
    """The kinds of log stream of a task: a worker's (``node-i.rank-r``), an agent's
    (``agent.<instance id>``) and a node's raw boot output (``boot.<instance id>``)."""

    NODE = "node"
    AGENT = "agent"
    BOOT = "boot"

    def __str__(self) -> str:
        return self.value


STREAM_KINDS: tuple[str, ...] = tuple(k.value for k in StreamKind)


def payload_key(digest: str) -> str:
    return f"payloads/{digest}"


def code_key(sha256: str) -> str:
    """The caller's SDK wheel (``flow_sdk.sdkwheel``), content-addressed by its SHA-256."""
    return f"code/{sha256}.whl"


def task_key(task_id: str) -> str:
    return f"tasks/{task_id}/task.json"


def outcome_key(task_id: str) -> str:
    return f"tasks/{task_id}/outcome.json"


def restart_key(task_id: str, generation: int) -> str:
    """Written by the node that decided a failed generation restarts (``max_restarts``)."""
    return f"tasks/{task_id}/restarts/{generation:06d}"


def restarts_prefix(task_id: str) -> str:
    return f"tasks/{task_id}/restarts/"


def decider_key(task_id: str, generation: int, slot: int = 0) -> str:
    """Claimed (put_if_absent, a signed record) by the one node that decides how a failed
    generation ends: the first slot that holds no forged claim."""
    return f"tasks/{task_id}/decider/{generation:06d}/{slot:02d}"


def agent_up_key(task_id: str, instance_id: str) -> str:
    """Written (put_if_absent) by a node's agent when it starts: the availability clock runs
    from the earliest of them."""
    return f"tasks/{task_id}/up/{instance_id}"


def agents_up_prefix(task_id: str) -> str:
    return f"tasks/{task_id}/up/"


def launch_key(task_id: str) -> str:
    return f"tasks/{task_id}/launch.json"


def launch_lease_key(task_id: str) -> str:
    """Kept by the launching client while it starts the task's nodes (``LaunchLease``)."""
    return f"tasks/{task_id}/launch-lease.json"


def membership_key(task_id: str, generation: int) -> str:
    """The gang of one generation, written once: by the launcher for generation 0, by the
    node that starts replacements for the next one."""
    return f"tasks/{task_id}/membership/{generation:06d}.json"


def cancel_key(task_id: str) -> str:
    return f"tasks/{task_id}/cancel"


def result_key(task_id: str, rank: int) -> str:
    return f"tasks/{task_id}/results/{rank:06d}"


def results_prefix(task_id: str) -> str:
    return f"tasks/{task_id}/results/"


def error_key(task_id: str, rank: int) -> str:
    return f"tasks/{task_id}/errors/{rank:06d}"


def node_key(task_id: str, node: int) -> str:
    return f"tasks/{task_id}/nodes/{node:06d}.json"


def nodes_prefix(task_id: str) -> str:
    return f"tasks/{task_id}/nodes/"


def task_prefix(task_id: str) -> str:
    return f"tasks/{task_id}/"


def rank_stream(node: int, rank: int) -> str:
    """The log stream of one worker."""
    return f"node-{node}.rank-{rank}"


def agent_stream(instance_id: str) -> str:
    """The log stream of one node's agent, named by instance so it exists before the rendezvous."""
    return f"agent.{instance_id}"


# Marks an agent line that reports a task event (a lost node, a restart, a replacement, the
# generation): the caller shows it among the workers' output, labelled [flow].
EVENT_MARK = "[flow] "


def to_json(record: Any) -> bytes:
    return json.dumps(asdict(record), sort_keys=True).encode()


def _fields_of(cls: type[Any], data: bytes) -> dict[str, Any]:
    """The JSON object in ``data`` as keyword arguments of the dataclass ``cls``; raises
    RecordError when it is not JSON or its keys are not ``cls``'s fields."""
    what = cls.__name__
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"{what}: not JSON ({exc}); run the same flow-sdk version on the "
                          "client and the nodes") from None
    if not isinstance(raw, dict):
        raise RecordError(f"{what}: expected a JSON object, got {type(raw).__name__}")
    raw.pop("mac", None)  # flow_sdk.signing's MAC, checked before the record is parsed
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
    payload_digest: str
    created_at: float
    rdzv_port: int
    master_port: int
    python: str = ""  # the caller's Python major.minor; the nodes refuse another one

    @classmethod
    def from_json(cls, data: bytes) -> TaskRecord:
        return cls(**_fields_of(cls, data))


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

    @classmethod
    def from_json(cls, data: bytes) -> NodeRecord:
        """The record in ``data``; raises RecordError for an unknown shape or phase."""
        raw = _fields_of(cls, data)
        raw["phase"] = NodePhase(_one_of("NodeRecord.phase", raw["phase"], NODE_PHASES))
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

    @classmethod
    def from_json(cls, data: bytes) -> Outcome:
        """The outcome in ``data``; raises RecordError for an unknown shape or status."""
        raw = _fields_of(cls, data)
        _one_of("Outcome.status", raw["status"], TERMINAL_STATUSES)
        return cls(**raw)


def boot_env_to_file(env: dict[str, str], path: Path) -> None:
    """Move ``FLOW_BOOT`` (it carries the task's secret) from ``env`` into a new 0600 file at
    ``path`` named by ``FLOW_BOOT_FILE``: the secret stays out of argv and environment dumps."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(env.pop("FLOW_BOOT"))
    env[BOOT_FILE_ENV] = str(path)


@dataclass(frozen=True)
class BootConfig:
    """What a node agent is started with (the same for every node of a task)."""

    task_id: str
    provider: str
    provider_config: Mapping[str, Any]
    secret: str = ""  # the task's secret (hex, flow_sdk.signing); never in the object store

    def to_env(self) -> dict[str, str]:
        data = {"task_id": self.task_id, "provider": self.provider,
                "provider_config": dict(self.provider_config), "secret": self.secret}
        return {"FLOW_BOOT": json.dumps(data, sort_keys=True)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> tuple[BootConfig, str, str]:
        """The boot config (from ``FLOW_BOOT``, or the 0600 file ``FLOW_BOOT_FILE`` names)
        plus this node's instance id and address."""
        file = environ.get(BOOT_FILE_ENV)
        data = json.loads(Path(file).read_text() if file else environ["FLOW_BOOT"])
        return (cls(task_id=data["task_id"], provider=data["provider"],
                    provider_config=data["provider_config"], secret=data.get("secret", "")),
                environ["FLOW_INSTANCE_ID"], environ["FLOW_NODE_ADDRESS"])
