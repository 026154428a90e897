"""The nodes a task's gang is drawn from, as the agent sees them: its own nodes, or a pool's.

A task launched on nodes of its own finds them through the provider (by the task's id),
replaces a lost node by launching a new one, and terminates lost nodes. A task on a pool runs
on the pool's warm nodes: a lost node's place goes to one of the task's spares (pool nodes that
stand by for it, named in its signed standby record) with no boot, and the pool keeps its
nodes: their daemons clean up after the task, and the pool replaces a spare it gave away. The
agent never asks which it has.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from flow_sdk import wire
from flow_sdk.errors import ProviderError, SignatureError
from flow_sdk.providers.base import Instance, LaunchRequest, Provider
from flow_sdk.spec import TaskSpec
from flow_sdk.wire import BootConfig, GangMember, MembershipRecord, signing
from flow_sdk.wire.pools import StandbyRecord, left_prefix, standby_key


class Gang(Protocol):
    """Where a task's nodes come from and go to."""

    def instances(self) -> list[Instance]:
        """The nodes the task may run on (what the membership fallback reads)."""
        ...

    def release(self, instance_ids: list[str]) -> None:
        """Take lost nodes out of the task."""
        ...

    def replace(self, spec: TaskSpec, count: int, taken: set[str]) -> list[GangMember]:
        """``count`` nodes for the next generation, none of them in ``taken``."""
        ...


class OwnNodes:
    """The task's own nodes: found, launched and terminated by the provider."""

    def __init__(self, provider: Provider, boot: BootConfig) -> None:
        self.provider, self.boot = provider, boot

    def instances(self) -> list[Instance]:
        return self.provider.list_instances(self.boot.task_id)

    def release(self, instance_ids: list[str]) -> None:
        self.provider.terminate_instances(self.boot.task_id, instance_ids)

    def replace(self, spec: TaskSpec, count: int, taken: set[str]) -> list[GangMember]:
        added = self.provider.add_instances(LaunchRequest(self.boot.task_id, spec, self.boot),
                                            count)
        return [GangMember(i.instance_id, i.address) for i in added]


class PoolNodes:
    """A pool task's nodes: the pool's, with the task's spares standing by."""

    def __init__(self, provider: Provider, store: signing.SignedStore, task_id: str) -> None:
        self.provider, self.store, self.task_id = provider, store, task_id

    def _standby(self) -> StandbyRecord:
        raw = self.store.get_record(standby_key(self.task_id))
        if raw is None:
            raise ProviderError(f"task {self.task_id} runs on a pool but its standby record "
                                "is missing; the launch was incomplete")
        return StandbyRecord.from_json(raw)

    def instances(self) -> list[Instance]:
        """The pool nodes given to the task; one whose daemon says it left the task (its
        agent exited, though the node runs on) reads as terminated."""
        standby = self._standby()
        raw = self.store.get_record(wire.membership_key(self.task_id, 0))
        ours = {m.instance_id for m in standby.spares}
        if raw is not None:
            ours.update(m.instance_id for m in MembershipRecord.from_json(raw).members)
        left = {key.rsplit("/", 1)[1] for key in self.store.list(left_prefix(self.task_id))
                if self._checked(key)}
        return [dataclasses.replace(i, state="terminated") if i.instance_id in left else i
                for i in self.provider.list_instances(standby.pool_id)
                if i.instance_id in ours]

    def _checked(self, key: str) -> bool:
        try:
            return self.store.get_record(key) is not None
        except SignatureError:
            return False

    def release(self, instance_ids: list[str]) -> None:
        """Nothing to stop: a pool's nodes belong to the pool. A lost node's daemon stops what
        the task left on it; a node that is gone is replaced by the pool."""
        return None

    def replace(self, spec: TaskSpec, count: int, taken: set[str]) -> list[GangMember]:
        standby = self._standby()
        running = {i.instance_id for i in self.provider.list_instances(standby.pool_id)
                   if i.state == "running"}
        free = [m for m in standby.spares if m.instance_id in running
                and m.instance_id not in taken]
        if len(free) < count:
            raise ProviderError(f"the task's pool has {len(free)} spare node(s) left and "
                                f"{count} node(s) were lost; make the pool with more spares "
                                "(spares=N, or `flow pool up --spares N`)")
        return free[:count]
