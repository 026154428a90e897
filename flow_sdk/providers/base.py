"""The one interface every provider implements.

Like SkyPilot's ``sky/provision``: each cloud implements the same small set of calls and the
caller never branches on the cloud. A provider plans and launches a task's nodes, lists and
terminates them, reaches them over SSH, offers an object store, a log store and named volumes
(and says what a node must do to mount them), and reclaims what ended tasks left behind
(``gc``). It is rebuilt from a JSON-safe ``config()`` by node agents and ``Task.from_id``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from flow_sdk.errors import FieldProblem, ProviderError, ValidationError, VolumeError
from flow_sdk.providers.capabilities import Capabilities
from flow_sdk.providers.gcreport import GcReport
from flow_sdk.spec import TaskSpec, VolumeSpec
from flow_sdk.wire import BootConfig

InstanceState = Literal["pending", "running", "terminated"]


@dataclass(frozen=True)
class SshEndpoint:
    host: str
    port: int
    user: str
    host_key: str  # "ssh-ed25519 AAAA..." as it appears in known_hosts, pinned at launch
    key_path: str  # private key the client uses, mode 0600


@dataclass(frozen=True)
class Instance:
    """One node of a task as the provider reports it."""

    instance_id: str
    task_id: str
    address: str  # the private address the other nodes reach it at
    state: InstanceState
    launched_at: float
    ssh: SshEndpoint | None = None
    usd_per_hour: float = 0.0  # what this node costs while it runs
    zone: str | None = None
    market: str = field(kw_only=True)  # "on-demand" | "spot" | "local"
    instance_type: str = field(kw_only=True)  # the provider's name for the machine
    waiting: str = field(default="", kw_only=True)  # pending: why, as a scheduler says it


@dataclass(frozen=True)
class LaunchRequest:
    """What a provider needs to start a task's nodes."""

    task_id: str
    spec: TaskSpec
    boot: BootConfig  # what the node agents start with (``BootConfig.encode``, carried as is)


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch would start, without starting it (``flow plan`` / ``app.plan``)."""

    provider: str
    instance_type: str
    region: str
    market: str
    usd_per_hour: float  # per node
    nodes: int
    max_run_time_hours: float | None
    zone: str | None = None
    alternatives: int = 0  # further offers failover would try, in order
    workers_per_node: int = 1  # worker processes each node starts (one per GPU slot)
    summary: str = ""  # the plan in one line, for plans that are not a rented offer
    price_source: str = ""  # where a price not from the GPU catalog comes from
    warnings: tuple[str, ...] = ()  # why a launch of it would be refused (launch_problems)

    @property
    def processes(self) -> int:
        """Worker processes the whole task runs."""
        return self.nodes * self.workers_per_node

    @property
    def cost_per_hour(self) -> float:
        return self.usd_per_hour * self.nodes

    @property
    def cost_at_cap(self) -> float | None:
        """The most the task can cost: hourly cost x the runtime cap (None when uncapped)."""
        if self.max_run_time_hours is None:
            return None
        return self.cost_per_hour * self.max_run_time_hours


def boot_stream(instance_id: str) -> str:
    """The log stream of a node's raw boot output: everything its bootstrap and agent wrote to
    stdout and stderr, one record per line, so a node that never reached user code can be
    debugged with ``task.logs(source="boot")``."""
    return f"boot.{instance_id}"


@dataclass(frozen=True)
class LogRecord:
    ts: float  # seconds since the epoch, taken on the node when the line was read
    text: str


def safe_part(value: str, what: str) -> str:
    """``value`` when it is safe as part of a store key or stream name (relative, no ``..``,
    no backslash); else ProviderError naming ``what``."""
    if not value or value.startswith("/") or ".." in value.split("/") or "\\" in value:
        raise ProviderError(f"unsafe {what} {value!r}: relative names without '..' only")
    return value


class ObjectStore(abc.ABC):
    """A flat key -> bytes store (a directory locally, S3 on AWS)."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write only when ``key`` is absent; True when this call wrote it."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when there is no such key."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``, sorted."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix``; returns how many were deleted."""

    def exists(self, key: str) -> bool:
        return self.get(key) is not None


class LogWriter(abc.ABC):
    @abc.abstractmethod
    def write(self, records: list[LogRecord]) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...


class LogStore(abc.ABC):
    """Named, append-only line streams per task (files locally, CloudWatch Logs on AWS).

    Readers page with an opaque integer cursor so ``follow`` never re-reads a line.
    """

    # The longest a line may take, after the time stamped on it, to become readable. A
    # ``follow`` holds each line back this long so that streams merge in time order; stores
    # that batch their uploads (CloudWatch Logs) set it to their flush interval.
    write_delay_s: ClassVar[float] = 0.2

    @abc.abstractmethod
    def writer(self, task_id: str, stream: str) -> LogWriter: ...

    @abc.abstractmethod
    def streams(self, task_id: str) -> list[str]: ...

    @abc.abstractmethod
    def read(self, task_id: str, stream: str, cursor: int = 0) -> tuple[list[LogRecord], int]:
        """Records after ``cursor`` and the cursor to pass next time."""


@dataclass(frozen=True)
class VolumeInfo:
    """A volume as its provider reports it."""

    name: str
    interface: str
    size_gb: int | None
    provider: str
    location: str  # local directory, EFS file system id or EBS volume id
    region: str | None = None
    created_at: float | None = None
    in_use_by: tuple[str, ...] = ()  # tasks or instances using it now


@dataclass(frozen=True)
class NodeMount:
    """One volume or S3 mount of the task, as a node provides it."""

    path: str  # the mount path the task asked for
    source: Path  # the directory on this node behind it
    read_only: bool
    origin: str  # "volume ckpt (file)" or the S3 URI
    premounted: bool = False  # already mounted at ``path`` (a cloud node's bootstrap)


Log = Callable[[str], None]


class Volumes(abc.ABC):
    """Named volumes of one provider: they outlive tasks until ``delete``."""

    @abc.abstractmethod
    def list(self) -> list[VolumeInfo]:
        """Every volume, sorted by name (then interface)."""

    @abc.abstractmethod
    def ensure(self, spec: VolumeSpec, *, zone: str | None = None) -> VolumeInfo:
        """The volume ``spec.name``, created when missing (idempotent). ``zone`` places a
        volume that lives in one availability zone; providers without zones ignore it."""

    @abc.abstractmethod
    def delete(self, name: str, *, force: bool = False) -> bool:
        """Delete the volume and its data; False when there is none. A volume a running task
        uses is kept (VolumeInUseError) unless ``force``."""

    @abc.abstractmethod
    def node_mounts(self, spec: TaskSpec, task_id: str, log: Log) -> list[NodeMount]:
        """On a node of the task: every volume of ``spec`` as this node provides it (created,
        attached or found mounted), sorted by path. Raises VolumeError naming the volume."""

    def local_path(self, name: str) -> Path | None:
        """The volume's data folder on this machine (None where the volumes live elsewhere)."""
        return None

    def shared_mount_caches(self) -> Path | None:
        """Where a task's nodes here share S3 mount caches (None: each node keeps its own)."""
        return None


class NoVolumes(Volumes):
    """The volumes of a provider that has none: every call says so."""

    def __init__(self, provider: str) -> None:
        self.provider = provider

    def _refuse(self) -> ValidationError:
        return ValidationError([FieldProblem("provider", f"provider {self.provider!r} has no "
                                                         "volumes; use local, aws or slurm")])

    def list(self) -> list[VolumeInfo]:
        raise self._refuse()

    def ensure(self, spec: VolumeSpec, *, zone: str | None = None) -> VolumeInfo:
        raise self._refuse()

    def delete(self, name: str, *, force: bool = False) -> bool:
        raise self._refuse()

    def node_mounts(self, spec: TaskSpec, task_id: str, log: Log) -> list[NodeMount]:
        raise VolumeError(f"provider {self.provider!r} has no volumes, so the task's volumes "
                          f"{sorted(spec.volumes)} cannot be mounted")


@dataclass(frozen=True)
class SchedulerEnd:
    """How a scheduler ended a task's nodes (``Provider.scheduler_end``)."""

    message: str  # what it did, naming the node where one was lost
    cancelled: bool = False  # someone outside the task cancelled its job: CANCELLED


class Provider(abc.ABC):
    """Launch, discover and terminate nodes; store objects and logs; volumes; gc."""

    name: ClassVar[str]
    # Whether nodes see this machine's file system (their processes run here): a relative
    # path the caller names is then made absolute for them instead of refused.
    shares_client_filesystem: ClassVar[bool] = False
    # What it honours of a task's options (``capabilities``); by default none of them.
    capabilities: ClassVar[Capabilities] = Capabilities()

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: Mapping[str, Any]) -> Provider:
        """Rebuild the provider from ``config()`` (on a node, or in another client process)."""

    @classmethod
    def attach(cls, config: Mapping[str, Any]) -> Provider:
        """The provider as ``from_config`` rebuilds it, for reading what already runs (list,
        status, logs, gc): it starts no service of its own. A provider that would (the
        simulated account's server) raises ``ProviderError`` saying what is not running."""
        return cls.from_config(config)

    @abc.abstractmethod
    def config(self) -> dict[str, Any]:
        """JSON-safe settings that ``from_config`` takes. Never holds credentials."""

    def node_config(self) -> dict[str, Any]:
        """``config()`` as the nodes take it (they may reach the cluster another way)."""
        return self.config()

    @property
    @abc.abstractmethod
    def store(self) -> ObjectStore: ...

    @property
    @abc.abstractmethod
    def logs(self) -> LogStore: ...

    @abc.abstractmethod
    def check(self, spec: TaskSpec) -> list[FieldProblem]:
        """Provider-specific problems with a spec, found before anything is launched."""

    def problems(self, spec: TaskSpec) -> list[FieldProblem]:
        """Everything that refuses ``spec`` here before anything is launched: the options the
        provider does not honour (``capabilities``), then its own ``check``."""
        return self.capabilities.problems(self.name, spec) + self.check(spec)

    def notes(self, spec: TaskSpec) -> list[str]:
        """What the provider runs ``spec`` without, each with what happens instead (shown
        with the plan)."""
        return self.capabilities.notes_for(self.name, spec)

    def launch_problems(self, spec: TaskSpec) -> list[FieldProblem]:
        """What refuses a launch of ``spec`` but not its plan, which launches nothing (the
        nodes' Python, for instance): ``plan`` shows these as warnings. Providers with none
        keep this default."""
        return []

    @abc.abstractmethod
    def launch(self, request: LaunchRequest) -> list[Instance]:
        """Start all ``spec.num_instances`` nodes as one gang, or none (a partial gang is
        terminated before this raises), each with its address; a node a scheduler queued is
        ``pending`` without one, and its agent asks ``list_instances`` once it runs."""

    @abc.abstractmethod
    def list_instances(self, task_id: str) -> list[Instance]:
        """Every node of the task in one (paged) call, sorted by instance id."""

    @abc.abstractmethod
    def terminate(self, task_id: str) -> None:
        """Stop every node of the task and everything running on it. Idempotent."""

    @property
    def volumes(self) -> Volumes:
        """The provider's named volumes; providers without any keep this default."""
        return NoVolumes(self.name)

    def gc(self, *, dry_run: bool = False, ended: Mapping[str, str] | None = None
           ) -> GcReport:
        """Reclaim what ended or orphaned tasks left behind (nodes, processes, resources);
        with ``dry_run`` only report it. ``ended`` names tasks that ``flow_sdk.lifecycle``
        judged ended (task id -> why), to reclaim as well; a provider never records how a
        task ended. Providers whose nodes cannot outlive a task keep this default."""
        raise ProviderError(f"the {self.name} provider has no garbage collector; stop its "
                            "leftovers with `flow cancel TASK`")

    def add_instances(self, request: LaunchRequest, count: int) -> list[Instance]:
        """Start ``count`` more nodes for a running task (replacements after a node loss,
        when ``max_restarts`` allows). Called from a node agent."""
        raise ProviderError(f"the {self.name} provider cannot add nodes to a running task, so "
                            "lost nodes cannot be replaced; set max_restarts=0")

    def terminate_instances(self, task_id: str, instance_ids: list[str]) -> None:
        """Stop some of a task's nodes (a lost node before its replacement starts)."""
        raise ProviderError(f"the {self.name} provider cannot terminate single nodes; "
                            "set max_restarts=0")

    def scheduler_end(self, task_id: str) -> SchedulerEnd | None:
        """How the provider's scheduler ended the task's nodes, asked once they all stopped
        without an outcome (a Slurm job cancelled with ``scancel``, or ended by a node that
        went down); None where nothing outside the task ended them, or it cannot tell.
        Providers without a scheduler keep this default."""
        return None

    def interruption_notice(self, instance_id: str) -> str | None:
        """The notice that this node (``instance_id``, the caller's own) is about to be taken
        away (a spot interruption), or None. Called by the node agent every few seconds, so it
        must be cheap. Providers whose nodes cannot be interrupted keep this default."""
        return None

    @abc.abstractmethod
    def plan(self, spec: TaskSpec) -> LaunchPlan:
        """The offer ``launch`` would try first (``flow plan``; it launches nothing)."""

    def rendezvous_ports(self) -> tuple[int, int]:
        """(agent store port, MASTER_PORT) for a new task. Cloud nodes own their ports. The
        store's port is not torchrun's rendezvous port (29400), which user code may open."""
        return 29471, 29500

    def shell_command(self, task_id: str, instance_id: str, command: str | None
                      ) -> list[str] | None:
        """The command line, run on the caller's machine, that opens a shell on the node
        (``command`` None) or runs ``command`` there, in its working folder: for providers
        that reach their nodes through their scheduler, not SSH. None: ``ssh_endpoint``."""
        return None

    def ssh_endpoint(self, task_id: str, instance_id: str) -> SshEndpoint:
        """How to reach one node of the task over SSH, with its host key pinned at launch.

        The default reads ``Instance.ssh`` from ``list_instances``. Raises ProviderError saying
        why when the node has no SSH endpoint."""
        for instance in self.list_instances(task_id):
            if instance.instance_id == instance_id and instance.ssh is not None:
                return instance.ssh
        raise ProviderError(f"the {self.name} provider reports no SSH endpoint for node "
                            f"{instance_id} of task {task_id}")
