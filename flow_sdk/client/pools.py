"""Pools of warm nodes, from the client: make one (``pool_up``), find one (``Pool.named``),
list them, take one down (a task on one: ``pooltasks``).

A pool is launched like a task whose nodes run the pool daemon (``BootConfig.role="pool"``):
``size + spares`` nodes of one shape under the pool's id, with a secret of the pool's own
(kept on this machine like task secrets). A task on a pool gets an id that starts with the
pool's, its own secret, and its code and arguments stored in the pool's folder (code by
digest: unchanged code is not stored again); the client picks the pool's nodes for its gang
and its spares, writes the task's records, and then one assignment per node, sealed with the
pool's secret and carrying the task's secret sealed under it, in the pool's order.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from flow_sdk.home import poolfiles, tasksecrets
from flow_sdk.providers import sdkwheel
from flow_sdk.client.records import list_client_records
from flow_sdk.client.task import Task
from flow_sdk.errors import (
    FieldProblem,
    PoolNotFoundError,
    ProviderError,
    RecordError,
    ServiceNotRunningError,
    SignatureError,
    ValidationError,
)
from flow_sdk.providers import attach_provider, get_provider
from flow_sdk.providers.base import Instance, LaunchRequest, Provider, boot_stream
from flow_sdk.spec import DEFAULT_IDLE_STOP_S, TaskSpec, build_task_spec
from flow_sdk.wire import BootConfig, signing
from flow_sdk.wire.pools import TASK_SEPARATOR, MemberRecord, PoolRecord, members_prefix, pool_key

POOL_APP = "flow-pool"
READY_POLL_S = 0.1
# What a pool's nodes are: the rest of a task's options (its code, environment, caps,
# restarts) belong to each task, not to the pool.
_NODE_OPTIONS = ("provider", "gpu", "image", "region", "volumes", "max_price_per_hour",
                 "priority", "internode_interconnect", "intranode_interconnect",
                 "boot_timeout_s", "availability_timeout_s", "key_name")


@functools.cache
def sdk_digest() -> str:
    """The digest of the SDK this process runs: a pool's nodes run the same one."""
    return sdkwheel.source_digest(sdkwheel.package_files(sdkwheel.package_dir()), [],
                                  sdkwheel.installed_version())


def new_pool_id(name: str) -> str:
    """``<name>-<yyyymmdd-hhmmss>-<random>``; never holds ``TASK_SEPARATOR``."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class PoolNode:
    """One node of a pool, as ``Pool.status`` reports it."""

    instance_id: str
    state: str  # "booting", "idle", "busy", "standby", "stopping", "stopped"
    task_id: str
    idle_s: float | None  # how long it has been idle; None while busy
    stop_at: float | None  # when its idle stop powers it off
    usd_per_hour: float
    template: str


@dataclass(frozen=True)
class PoolStatus:
    """What ``flow pool list`` shows of a pool."""

    name: str
    pool_id: str
    provider: str
    state: str  # "starting", "up", "stopped"
    size: int
    spares: int
    idle_stop_s: float
    nodes: list[PoolNode]

    @property
    def usd_per_hour(self) -> float:
        return sum(n.usd_per_hour for n in self.nodes if n.state != "stopped")

    @property
    def stop_at(self) -> float | None:
        """When the pool stops if no task comes: the last of its idle nodes' stops."""
        live = [n for n in self.nodes if n.state != "stopped"]
        if not live or any(n.stop_at is None for n in live):
            return None
        return max(n.stop_at for n in live if n.stop_at is not None)

    @property
    def idle_s(self) -> float | None:
        """How long the pool has been idle (its most recently busy node); None while a task
        runs on it."""
        live = [n for n in self.nodes if n.state != "stopped"]
        if not live or any(n.idle_s is None for n in live):
            return None
        return min(n.idle_s for n in live if n.idle_s is not None)


class Pool:
    """A pool this machine made."""

    def __init__(self, name: str, pool_id: str, provider: Provider) -> None:
        self.name, self.pool_id, self.provider = name, pool_id, provider
        self._signed: signing.SignedStore | None = None

    def __repr__(self) -> str:
        return f"Pool({self.name!r}, id={self.pool_id!r}, provider={self.provider.name!r})"

    @classmethod
    def named(cls, name: str, provider: Provider | None = None) -> Pool:
        """The pool ``name`` this machine made; ``PoolNotFoundError`` when there is none.
        ``provider``, when it is the pool's (same name and configuration), is used as is."""
        found = poolfiles.load_pool_file(name)
        if found is None:
            raise PoolNotFoundError(f"no pool {name!r} on this machine; `flow pool list` shows "
                                    f"the pools, `flow pool up {name} ...` makes one")
        same = provider is not None and provider.name == found.provider and json.dumps(
            provider.config(), sort_keys=True) == json.dumps(found.provider_config,
                                                             sort_keys=True)
        return cls(name, found.pool_id, provider if same and provider is not None else
                   pool_provider(found.provider, found.provider_config, attach=True))

    @property
    def store(self) -> signing.SignedStore:
        """The provider's store seen through the pool's secret."""
        if self._signed is None:
            self._signed = signing.SignedStore(
                self.provider.store, lambda: tasksecrets.load_task_secret(self.pool_id))
        return self._signed

    def record(self) -> PoolRecord | None:
        raw = self.store.get_record(pool_key(self.pool_id))
        return None if raw is None else PoolRecord.from_json(raw)

    def members(self) -> dict[str, MemberRecord]:
        """Each node's last report, by instance id (forged or unreadable ones left out)."""
        found = {}
        for key in self.provider.store.list(members_prefix(self.pool_id)):
            try:
                raw = self.store.get_record(key)
                if raw is not None:
                    member = MemberRecord.from_json(raw)
                    found[member.instance_id] = member
            except (SignatureError, RecordError):
                continue
        return found

    def instances(self) -> list[Instance]:
        return self.provider.list_instances(self.pool_id)

    def status(self, now: float | None = None) -> PoolStatus:
        now = time.time() if now is None else now
        record = self.record()
        members = self.members()
        nodes = []
        for instance in self.instances():
            member = members.get(instance.instance_id)
            state = "stopped" if instance.state == "terminated" else (
                member.state if member is not None else "booting")
            idle = member is not None and member.state == "idle"
            nodes.append(PoolNode(
                instance.instance_id, state, member.task_id if member else "",
                now - member.idle_since if idle and member else None,
                member.stop_at if idle and member else None, instance.usd_per_hour,
                member.template if member else ""))
        live = any(n.state != "stopped" for n in nodes)
        state = "stopped" if not live else (record.state if record is not None else "starting")
        return PoolStatus(self.name, self.pool_id, self.provider.name, state,
                          record.size if record else 0, record.spares if record else 0,
                          record.idle_stop_s if record else 0.0, nodes)

    def is_up(self) -> bool:
        return any(i.state == "running" for i in self.instances())

    def wait_ready(self, timeout_s: float) -> None:
        """Until every node's daemon reports itself (idle, warm); ``ProviderError`` naming the
        nodes that did not, with the end of their boot output, after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            instances = [i for i in self.instances() if i.state == "running"]
            members = self.members()
            waiting = [i.instance_id for i in instances if i.instance_id not in members]
            if instances and not waiting:
                return
            gone = [i.instance_id for i in self.instances() if i.state == "terminated"]
            if gone or time.monotonic() > deadline:
                why = "stopped while booting" if gone else f"not ready after {timeout_s:g}s"
                tail = self._boot_tail(gone or waiting)
                raise ProviderError(f"pool {self.name!r}: node(s) {', '.join(gone or waiting)} "
                                    f"{why}; the end of their boot output:\n{tail}")
            time.sleep(READY_POLL_S)

    def _boot_tail(self, instance_ids: list[str]) -> str:
        lines = []
        for instance_id in instance_ids:
            records, _ = self.provider.logs.read(self.pool_id, boot_stream(instance_id))
            lines += [f"  [{instance_id}] {r.text}" for r in records[-15:]]
        return "\n".join(lines) or "  (none)"

    def down(self) -> None:
        """Stop every node of the pool (a task running on it is cancelled first) and forget
        the pool. Idempotent."""
        cancel_pool_tasks(self)
        self.provider.terminate(self.pool_id)
        poolfiles.remove_pool_file(self.name, self.pool_id)
        tasksecrets.remove_task_secret(self.pool_id)


def cancel_pool_tasks(pool: Pool) -> list[str]:
    """Cancel the tasks of ``pool`` that this machine launched and that have not ended."""
    cancelled = []
    for rec in list_client_records():
        task_id = rec["task_id"]
        if not task_id.startswith(pool.pool_id + TASK_SEPARATOR):
            continue
        task = Task(task_id, pool.provider)
        if tasksecrets.has_task_secret(task_id) and not task.status.is_terminal:
            task.cancel()
            cancelled.append(task_id)
    return cancelled


# -- making a pool ----------------------------------------------------------------------------

def pool_up(name: str, *, provider: str = "local",
            provider_config: dict[str, Any] | None = None, num_instances: int = 1,
            spares: int = 0, idle_stop: str | float | None = None, **options: Any) -> Pool:
    """Make the pool ``name``: ``num_instances`` nodes for its tasks and ``spares`` standing
    by, of the shape ``options`` give (``gpu=``, ``image=``, ``volumes=``, ``region=``, ...,
    as on ``@app.function``), stopping after ``idle_stop`` without a task ("30m" when unset).
    Returns once every node is warm. Bad options raise ``ValidationError`` naming them, before
    anything starts."""
    spec = build_task_spec(app=POOL_APP, name=name, provider=provider, pool=name,
                           num_instances=num_instances, spares=spares,
                           idle_stop=DEFAULT_IDLE_STOP_S if idle_stop is None else idle_stop,
                           **options)
    backend = pool_provider(provider, provider_config)
    problems = backend.problems(spec) + backend.launch_problems(spec)
    if problems:
        raise ValidationError(problems)
    return start_pool(backend, spec)


def pool_provider(name: str, config: dict[str, Any] | None, *, attach: bool = False
                  ) -> Provider:
    """The pool's provider; with ``attach``, for a pool that exists: no service is started
    (``Provider.attach``)."""
    try:
        return attach_provider(name, config) if attach else get_provider(name, config)
    except ServiceNotRunningError:
        raise
    except ProviderError as exc:
        raise ValidationError([FieldProblem("provider", str(exc))]) from None


def pool_spec(spec: TaskSpec) -> TaskSpec:
    """The shape of the pool a task makes when its pool does not exist: the task's nodes
    (and spares), without what belongs to each task."""
    chosen = {k: getattr(spec, k) for k in _NODE_OPTIONS}
    return build_task_spec(app=POOL_APP, name=spec.pool, pool=spec.pool,
                           num_instances=spec.num_instances, spares=spec.spares,
                           idle_stop=spec.idle_stop or DEFAULT_IDLE_STOP_S,
                           **{k: v.model_dump() if hasattr(v, "model_dump") else v
                              for k, v in chosen.items() if k != "volumes"},
                           volumes={p: v.model_dump() for p, v in spec.volumes.items()})


def start_pool(provider: Provider, spec: TaskSpec) -> Pool:
    """Launch the pool ``spec`` describes (``spec.pool`` names it) and wait for its nodes."""
    assert spec.pool is not None and spec.idle_stop is not None
    name = spec.pool
    existing = poolfiles.load_pool_file(name)
    if existing is not None:
        try:
            old: Pool | None = Pool(name, existing.pool_id, pool_provider(
                existing.provider, existing.provider_config, attach=True))
        except ServiceNotRunningError:
            old = None  # its provider's service stopped, and the pool with it
        if existing.launching or old is not None and old.is_up():
            raise ValidationError([FieldProblem("pool", (
                f"pool {name!r} is up already ({old.pool_id}); run tasks on it with "
                f"pool={name!r}, or take it down first: `flow pool down {name}`"))])
        poolfiles.remove_pool_file(name, existing.pool_id)  # stopped on its own: forget it
    pool_id = new_pool_id(name)
    secret = signing.new_secret()
    tasksecrets.save_task_secret(pool_id, secret)
    created = time.time()
    poolfiles.save_pool_file(poolfiles.launching_here(name, pool_id, provider.name,
                                                      provider.config(), created))
    pool = Pool(name, pool_id, provider)
    record = PoolRecord(name, pool_id, spec.model_dump(mode="json"), spec.num_instances,
                        spec.spares, spec.idle_stop, created, "starting", sdk_digest(),
                        sdkwheel.python_version())
    pool.store.put_record(pool_key(pool_id), record)
    nodes = spec.model_copy(update={"num_instances": spec.num_instances + spec.spares})
    boot = BootConfig(pool_id, provider.name, provider.node_config(), secret=secret,
                      role="pool")
    try:
        provider.launch(LaunchRequest(pool_id, nodes, boot))
        pool.wait_ready(spec.boot_timeout_s)
    except BaseException:
        provider.terminate(pool_id)
        poolfiles.remove_pool_file(name, pool_id)
        tasksecrets.remove_task_secret(pool_id)
        raise
    pool.store.put_record(pool_key(pool_id), dataclasses.replace(record, state="up"))
    poolfiles.save_pool_file(poolfiles.PoolFile(name, pool_id, provider.name,
                                                provider.config(), created, 0, None))
    return pool


def pool_is_up(name: str | None, provider: Provider | None = None) -> bool:
    """Whether this machine made the pool ``name`` and a node of it runs."""
    if name is None or poolfiles.load_pool_file(name) is None:
        return False
    return Pool.named(name, provider).is_up()


def list_pools() -> list[PoolStatus]:
    """Every pool this machine made, with its nodes, by name."""
    return [_status(f) for f in poolfiles.list_pool_files()]


def _status(found: poolfiles.PoolFile) -> PoolStatus:
    try:
        return Pool.named(found.name).status()
    except ServiceNotRunningError:  # its provider's service stopped, and the pool with it
        return PoolStatus(found.name, found.pool_id, found.provider, "stopped", 0, 0, 0.0, [])
