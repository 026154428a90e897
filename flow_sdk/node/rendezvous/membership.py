"""Who is in the task and which rank each node takes: ranks follow sorted instance ids.

Membership comes from the record that whoever started the nodes wrote (:func:`from_record`:
one read, retried while absent); the provider's instance list (:func:`discover`) is the
fallback when that record stays absent or does not name this node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from flow_sdk.errors import RendezvousError


class Addressed(Protocol):
    @property
    def instance_id(self) -> str: ...
    @property
    def address(self) -> str: ...


class Member(Addressed, Protocol):
    @property
    def state(self) -> str: ...


@dataclass(frozen=True)
class Membership:
    node_rank: int
    num_nodes: int
    leader_address: str
    instance_ids: tuple[str, ...]  # in rank order
    addresses: tuple[str, ...]  # in rank order

    @property
    def is_leader(self) -> bool:
        return self.node_rank == 0


def assign_ranks(members: Sequence[Addressed], self_id: str) -> Membership:
    """Rank = position in the instance ids sorted ascending; rank 0 leads."""
    ordered = sorted(members, key=lambda m: m.instance_id)
    ids = tuple(m.instance_id for m in ordered)
    if self_id not in ids:
        raise RendezvousError(f"this node ({self_id}) is not among the task's running "
                              f"instances {list(ids)}")
    return Membership(node_rank=ids.index(self_id), num_nodes=len(ids),
                      leader_address=ordered[0].address, instance_ids=ids,
                      addresses=tuple(m.address for m in ordered))


def discover(list_members: Callable[[], Sequence[Member]], self_id: str, expected: int,
             minimum: int, timeout_s: float, poll_s: float = 0.25, max_poll_s: float = 2.0,
             clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> Membership:
    """Poll the provider's instance list (one call per poll) until ``expected`` nodes run:
    every ``poll_s`` at first, then less often, up to ``max_poll_s`` apart (every node of a
    large task polls, and schedulers and clouds limit their callers' request rates).

    It settles for ``minimum`` or more running nodes after ``timeout_s``, or at once when no
    node is still coming (every expected node runs or ended: a scheduler gave the job fewer
    nodes than it asked for); below ``minimum`` it raises, naming the nodes that are not
    running.
    """
    deadline = clock() + timeout_s
    while True:
        members = list_members()
        running = [m for m in members if m.state == "running"]
        settled = len(members) >= expected and all(m.state != "pending" for m in members)
        if len(running) >= expected or settled and len(running) >= minimum:
            return assign_ranks(running, self_id)
        if clock() >= deadline:
            if len(running) >= minimum:
                return assign_ranks(running, self_id)
            missing = [f"{m.instance_id} ({m.state})" for m in members if m.state != "running"]
            unlaunched = expected - len(members)
            detail = ", ".join(missing) if missing else "none reported"
            raise RendezvousError(
                f"only {len(running)} of {expected} nodes were running after {timeout_s:.0f}s "
                f"(need at least {minimum}); not running: {detail}"
                + (f"; {unlaunched} never appeared" if unlaunched > 0 else "")
                + ". Raise availability_timeout_s or lower min_instances.")
        sleep(poll_s)
        poll_s = min(poll_s * 1.5, max_poll_s)


def from_record(read: Callable[[], Sequence[Addressed] | None], self_id: str, grace_s: float,
                poll_s: float = 0.1, clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> Membership | None:
    """Ranks from the membership record: ``read`` is one read of it (None while it is absent),
    retried every ``poll_s`` for up to ``grace_s``. None when the record stays absent, is
    stale (it does not name ``self_id``: e.g. a replacement node the record predates), or
    lacks an address (the launch queued the nodes, as a scheduler does, before they had
    one); the caller then falls back to :func:`discover`."""
    deadline = clock() + grace_s
    while True:
        members = read()
        if members is not None:
            if all(m.address for m in members) and any(m.instance_id == self_id
                                                       for m in members):
                return assign_ranks(members, self_id)
            return None
        if clock() >= deadline:
            return None
        sleep(poll_s)
