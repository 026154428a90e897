"""The node's records in the task's object store, every one signed with the task's secret.

The agent reads the task record, cancel requests, restart decisions and membership records,
and writes its node record, the task's outcome (through ``lifecycle``: first writer wins),
restart decisions, the next generation's membership, and its workers' results and error
payloads.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Callable

from flow_sdk import lifecycle, wire
from flow_sdk.errors import SignatureError
from flow_sdk.wire import (
    GangMember,
    MembershipRecord,
    NodePhase,
    NodeRecord,
    Outcome,
    TaskStatus,
)
from flow_sdk.node.rendezvous import Membership
from flow_sdk.node.rendezvous.store import FailureReport
from flow_sdk.wire.signing import SignedStore


class NodeRecords:
    """One node's view of its task's records; a record without the task's MAC is ignored."""

    def __init__(self, store: SignedStore, task_id: str, instance_id: str, address: str,
                 log: Callable[[str], None]) -> None:
        self.store = store  # checks every read
        self.task_id = task_id
        self.instance_id = instance_id
        self.address = address
        self._log = log

    def checked(self, key: str) -> bytes | None:
        """A record that carries the task's MAC; None when absent or forged (logged)."""
        try:
            return self.store.get_record(key)
        except SignatureError as exc:
            self._log(f"ignored a forged record: {exc}")
            return None

    # -- this node and the task's end ---------------------------------------------------------

    def write_node(self, m: Membership, phase: NodePhase, workers: int = 0,
                   activity: str = "") -> None:
        """This node's record: its phase, its workers and what they are doing (one of
        ``wire.records.WORKER_ACTIVITIES``, "" when none or unknown)."""
        record = NodeRecord(m.node_rank, self.instance_id, self.address, phase, time.time(),
                            workers, activity)
        self.store.put_record(wire.node_key(self.task_id, m.node_rank), record)

    def write_outcome(self, outcome: Outcome) -> bool:
        """Writes the task's outcome unless one is there; whether this call wrote it."""
        wrote = lifecycle.record_outcome(self.store, self.task_id, outcome)
        if wrote:
            self._log(f"task {outcome.status}: {outcome.message}")
        return wrote

    def fail(self, message: str, label: str, node: int | None = None) -> None:
        self.write_outcome(Outcome(TaskStatus.FAILED.value, message, time.time(), node=node,
                                   label=label))

    def outcome_written(self) -> bool:
        return lifecycle.ended(self.store, self.task_id) is not None

    def cancelled(self) -> bool:
        return self.checked(wire.cancel_key(self.task_id)) is not None

    def ended_cancelled(self) -> bool:
        """Whether the task's outcome is CANCELLED (a cancel ends it whatever a node saw
        after: a SIGTERM, its leader's store gone)."""
        outcome = lifecycle.ended(self.store, self.task_id)
        return outcome is not None and outcome.status == TaskStatus.CANCELLED.value

    def put_result(self, rank: int, data: bytes) -> None:
        self.store.put_blob(wire.result_key(self.task_id, rank), data)

    def put_error(self, rank: int, data: bytes) -> None:
        self.store.put_blob(wire.error_key(self.task_id, rank), data)

    # -- generations --------------------------------------------------------------------------

    def restarts(self) -> dict[str, bytes]:
        """The restart decisions that carry the task's MAC, by key; others are ignored."""
        found = {}
        for key in self.store.list(wire.restarts_prefix(self.task_id)):
            raw = self.checked(key)
            if raw is not None and key.rsplit("/", 1)[1].isdigit():
                found[key] = raw
        return found

    def current_generation(self) -> int:
        return max((int(k.rsplit("/", 1)[1]) for k in self.restarts()), default=0)

    def replaced(self) -> set[str]:
        """Instance ids that a decider replaced: gone, or about to go (a node that decided its
        own replacement terminates itself last), so never members of a later generation."""
        found: set[str] = set()
        for raw in self.restarts().values():
            replaced = json.loads(raw).get("replaced", [])
            found.update(r for r in replaced if isinstance(r, str))
        return found

    def restart_decided(self, gen: int) -> bool:
        """Whether a decider opened generation ``gen``."""
        return self.checked(wire.restart_key(self.task_id, gen)) is not None

    def write_restart(self, gen: int, reason: FailureReport, replaced: list[str]) -> None:
        self.store.put_record(wire.restart_key(self.task_id, gen),
                              {"reason": asdict(reason), "replaced": replaced})

    def members(self, gen: int) -> list[GangMember] | None:
        """The gang that generation ``gen``'s membership record names; None when absent.
        Raises SignatureError for a forged record."""
        raw = self.store.get_record(wire.membership_key(self.task_id, gen))
        return None if raw is None else MembershipRecord.from_json(raw).members

    def write_members(self, gen: int, members: list[GangMember]) -> None:
        self.store.put_record(wire.membership_key(self.task_id, gen),
                              MembershipRecord(gen, members, time.time()))

    def claim(self, key: str) -> bool | None:
        """Puts this node's signed claim at ``key``: True when it is there now, False when
        another node's claim is, None when the key holds a forgery."""
        if self.store.put_record_if_absent(key, {"instance_id": self.instance_id}):
            return True
        return False if self.checked(key) is not None else None
