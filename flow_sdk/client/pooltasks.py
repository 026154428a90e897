"""A task on a pool: does it fit the pool, which nodes it gets, and its launch.

The client picks the pool's ready nodes for the task's gang (by instance id) and gives it the
others as spares; it claims the task's place in the pool's order (which names the task:
``<pool id>.<function>-<number>``), stores the call's code and arguments in the pool's folder
by digest (unchanged code is not stored again), writes the task's records sealed with the
task's own secret, and writes one assignment per node, sealed with the pool's secret,
carrying the task's secret sealed under it.
"""

from __future__ import annotations

import re
import shlex
import time
from typing import Any

from flow_sdk import payload, wire
from flow_sdk.home import poolfiles, tasksecrets
from flow_sdk.providers import sdkwheel
from flow_sdk.client.pools import Pool, pool_spec, sdk_digest, start_pool
from flow_sdk.client.records import save_client_record
from flow_sdk.client.task import Task
from flow_sdk.errors import (
    FieldProblem,
    PoolMismatchError,
    PoolNotFoundError,
    ProviderError,
    RecordError,
    SignatureError,
)
from flow_sdk.providers.base import Instance, Provider
from flow_sdk.spec import DEFAULT_IDLE_STOP_S, TaskSpec, VolumeSpec
from flow_sdk.wire import (
    GangMember,
    LaunchedNode,
    LaunchRecord,
    MembershipRecord,
    TaskRecord,
    signing,
)
from flow_sdk.wire.pools import (
    TASK_SEPARATOR,
    Assignment,
    PoolRecord,
    SequenceClaim,
    StandbyRecord,
    assignment_key,
    sequence_key,
    sequence_number,
    sequence_prefix,
    standby_key,
)

STOP_MARGIN_S = 5.0  # a node this close to its idle stop is not given a task
_DEFAULT_VOLUME_GB = VolumeSpec.model_fields["size_gb"].default
_SLUG_CHARS = 12  # of the function's name in a pool task's id


def fit_problems(record: PoolRecord, spec: TaskSpec, instances: list[Instance]
                 ) -> list[FieldProblem]:
    """How ``spec`` does not fit the pool ``record`` describes, whose nodes are
    ``instances`` (empty when it fits)."""
    pool = TaskSpec.model_validate(record.spec)
    name = record.name
    problems = []

    def differs(field: str, mine: Any, theirs: Any, fix: str) -> None:
        if mine != theirs:
            problems.append(FieldProblem(field, f"the task asks for {mine!r}; pool {name!r} "
                                                f"has {theirs!r}: {fix}"))

    take_down = f"take the pool down (`flow pool down {name}`) to make it again"
    differs("provider", spec.provider, pool.provider, f"use provider={pool.provider!r}, or "
            + take_down)
    differs("gpu", str(spec.gpu) if spec.gpu else None, str(pool.gpu) if pool.gpu else None,
            "ask for the pool's GPUs, or " + take_down)
    differs("image", spec.image, pool.image, "use the pool's image, or " + take_down)
    if spec.region is not None:
        differs("region", spec.region, pool.region, "drop region, or " + take_down)
    if spec.num_instances > record.size:
        problems.append(FieldProblem("num_instances", (
            f"the task needs {spec.num_instances} node(s); pool {name!r} has {record.size} "
            f"(and {record.spares} spare(s)): use at most {record.size}, or " + take_down)))
    if spec.spares > record.spares:
        problems.append(FieldProblem("spares", (
            f"the task asks for {spec.spares} spare(s); pool {name!r} keeps {record.spares}: "
            + take_down)))
    if spec.idle_stop is not None:
        differs("idle_stop", spec.idle_stop, record.idle_stop_s,
                "drop idle_stop (the pool's applies), or " + take_down)
    missing = sorted(p for p, v in spec.volumes.items() if pool.volumes.get(p) != v)
    if missing:
        remake = pool_up_line(record, pool, {**pool.volumes, **spec.volumes})
        problems.append(FieldProblem("volumes", (
            f"the task mounts {missing}, which pool {name!r}'s nodes do not mount as asked "
            f"(they mount {sorted(pool.volumes) or 'none'}): make the pool again with them, "
            f"`flow pool down {name}` then `{remake}`; or drop them from the task")))
    if record.sdk != sdk_digest() or record.python != sdkwheel.python_version():
        problems.append(FieldProblem("pool", (
            f"pool {name!r} runs another flow-sdk or Python than this client (pool "
            f"{record.sdk[:12]} on Python {record.python}, this client {sdk_digest()[:12]} on "
            f"Python {sdkwheel.python_version()}): " + take_down)))
    if spec.max_price_per_hour is not None:
        prices = [i.usd_per_hour for i in instances if i.state == "running"]
        if prices and max(prices) > spec.max_price_per_hour:
            problems.append(FieldProblem("max_price_per_hour", (
                f"pool {name!r}'s nodes cost ${max(prices):.4f}/h, above the task's cap "
                f"${spec.max_price_per_hour:.4f}/h: raise the cap, or " + take_down)))
    return problems


def pool_up_line(record: PoolRecord, pool: TaskSpec, volumes: dict[str, VolumeSpec]) -> str:
    """The ``flow pool up`` command that makes the pool ``record`` describes again, in the
    same shape (``pool``, its spec) but mounting ``volumes``; defaults are left out."""
    args = ["flow", "pool", "up", record.name]
    if pool.gpu is not None:
        args += ["--gpu", str(pool.gpu)]
    args += ["-N", str(record.size)]
    if record.spares:
        args += ["--spares", str(record.spares)]
    if record.idle_stop_s != DEFAULT_IDLE_STOP_S:
        args += ["--idle-stop", _duration(record.idle_stop_s)]
    for flag, value, default in (("--image", pool.image, None),
                                 ("--region", pool.region, None),
                                 ("--max-price-per-hour", pool.max_price_per_hour, None),
                                 ("--priority", pool.priority, "med"),
                                 ("--provider", pool.provider, "local")):
        if value != default:
            args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    for path, volume in sorted(volumes.items()):
        text = volume.name
        if volume.interface != "file" or volume.size_gb != _DEFAULT_VOLUME_GB:
            text += f":{volume.size_gb}"
        if volume.interface != "file":
            text += f":{volume.interface}"
        args += ["--volume", f"{path}={text}"]
    return shlex.join(args)


def _duration(seconds: float) -> str:
    """``2h``, ``10m`` or ``45s``, as ``--idle-stop`` reads it back."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def pool_for(provider: Provider, spec: TaskSpec) -> tuple[Pool, PoolRecord, list[Instance]]:
    """The live pool ``spec.pool`` names (made with the task's shape when there is none), its
    record and its nodes; ``PoolMismatchError`` when the task does not fit it."""
    assert spec.pool is not None
    pool = Pool.named(spec.pool, provider) if poolfiles.load_pool_file(spec.pool) else None
    instances = [] if pool is None else pool.instances()
    if pool is None or not any(i.state == "running" for i in instances):
        pool = start_pool(provider, pool_spec(spec))
        instances = pool.instances()
    record = pool.record()
    if record is None:
        raise PoolNotFoundError(f"pool {spec.pool!r} ({pool.pool_id}) has no record in its "
                                f"store; take it down (`flow pool down {spec.pool}`) and "
                                "make it again")
    problems = fit_problems(record, spec, instances)
    if problems:
        raise PoolMismatchError(problems)
    return pool, record, instances


def _pick_nodes(pool: Pool, spec: TaskSpec, instances: list[Instance]
                ) -> tuple[list[Instance], list[Instance]]:
    """The task's gang (the first ``num_instances`` ready nodes by instance id) and its spares
    (every other ready node)."""
    now = time.time()
    members = pool.members()
    ready = [i for i in instances if i.state == "running"
             and (m := members.get(i.instance_id)) is not None and m.state != "stopping"
             and (m.stop_at is None or m.stop_at > now + STOP_MARGIN_S)]
    if len(ready) < spec.num_instances:
        raise ProviderError(f"pool {pool.name!r} has {len(ready)} ready node(s) and the task "
                            f"needs {spec.num_instances}; `flow pool list` shows its nodes")
    return ready[:spec.num_instances], ready[spec.num_instances:]


def launch_on_pool(provider: Provider, spec: TaskSpec, packed: payload.PackedCall) -> Task:
    """Launch a task on the pool ``spec.pool`` names (see the module docstring)."""
    pool, record, instances = pool_for(provider, spec)
    provider = pool.provider
    gang, spares = _pick_nodes(pool, spec, instances)
    number, task_id = _claim(pool, spec.name)
    secret = signing.new_secret()
    tasksecrets.save_task_secret(task_id, secret)
    signed = signing.SignedStore(provider.store, signing.secret_from_hex(secret))
    digests = []
    for blob in (packed.args, packed.code):
        digest = payload.digest(blob)
        provider.store.put_if_absent(wire.payload_key(digest, pool.pool_id), blob)
        digests.append(digest)
    rdzv_port, master_port = provider.rendezvous_ports()
    now = time.time()
    signed.put_record(wire.task_key(task_id), TaskRecord(
        task_id, spec.model_dump(mode="json"), digests[0], now, rdzv_port, master_port,
        python=sdkwheel.python_version(), code_digest=digests[1],
        imports_torch="torch" in packed.imports))
    save_client_record(task_id, provider, {"app": spec.app, "name": spec.name,
                                           "created_at": now, "pool": pool.name})
    signed.put_record(wire.membership_key(task_id, 0), MembershipRecord(0, [
        GangMember(i.instance_id, i.address) for i in gang], now))
    signed.put_record(standby_key(task_id), StandbyRecord(pool.pool_id, [
        GangMember(i.instance_id, i.address) for i in spares]))
    signed.put_record(wire.launch_key(task_id), LaunchRecord(now, [
        LaunchedNode(i.instance_id, i.instance_type, i.market, i.usd_per_hour, i.zone)
        for i in gang + spares]))
    pool_secret = tasksecrets.load_task_secret(pool.pool_id)
    for role, nodes in (("run", gang), ("standby", spares)):
        for instance in nodes:
            key = assignment_key(pool.pool_id, instance.instance_id, number)
            pool.store.put_record(key, Assignment(
                number, task_id, role, signing.seal_secret(pool_secret, key,
                                                           bytes.fromhex(secret)), now))
    return Task(task_id, provider)


def pool_task_id(pool_id: str, name: str, number: int) -> str:
    """``<pool id>.<function>-<number>``: the task's place in the pool's order makes it unique
    (the pool id carries the date), so the id stays short and says which task it was."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:_SLUG_CHARS].strip("-")
    return f"{pool_id}{TASK_SEPARATOR}{slug or 'task'}-{number}"


def _claim(pool: Pool, name: str) -> tuple[int, str]:
    """The task's place in the pool's order and its id (``pool_task_id``): the number after
    the highest claim sealed with the pool's secret, claimed atomically (a number already
    taken moves it on). Junk under the prefix (a key no client writes, a claim not sealed
    with the pool's secret) is no claim: it neither fails the launch nor moves the order.
    The pool's nodes act on assignments only, so claiming before the task's records are
    written starts nothing."""
    found = (sequence_number(pool.pool_id, key)
             for key in pool.provider.store.list(sequence_prefix(pool.pool_id)))
    numbers = sorted({n for n in found if n is not None}, reverse=True)
    number = next((n + 1 for n in numbers if _sealed_claim(pool, n)), 0)
    while True:
        task_id = pool_task_id(pool.pool_id, name, number)
        if pool.store.put_record_if_absent(sequence_key(pool.pool_id, number),
                                           SequenceClaim(task_id)):
            return number, task_id
        number += 1


def _sealed_claim(pool: Pool, number: int) -> bool:
    """Whether the pool's ``number``-th claim is one of its clients' (sealed, well formed)."""
    try:
        raw = pool.store.get_record(sequence_key(pool.pool_id, number))
        return raw is not None and isinstance(SequenceClaim.from_json(raw).task_id, str)
    except (SignatureError, RecordError):
        return False
