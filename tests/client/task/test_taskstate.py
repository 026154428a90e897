"""How the caller reads a task's state (``client.taskstate``) for nodes a scheduler queues:
PROVISIONING while they wait, FAILED once they waited past ``availability_timeout_s``, and
never an exception from a status read when the task's record is forged."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from flow_sdk.client import taskstate
from flow_sdk.errors import SignatureError
from flow_sdk.providers.base import Instance
from flow_sdk.spec import TaskSpec, build_task_spec
from flow_sdk.wire import NodeRecord, Outcome, TaskRecord, TaskStatus

REASON = "queued by Slurm: Resources (the nodes it needs are busy)"


@dataclass
class _Queued:
    """A task whose nodes a scheduler has queued since ``launched_at``."""

    launched_at: float
    reason: str = REASON
    forged: bool = False
    task_id: str = "t-1"
    spec_reads: list[int] = field(default_factory=list)

    @property
    def spec(self) -> TaskSpec:
        self.spec_reads.append(1)
        if self.forged:
            raise SignatureError("tasks/t-1/task.json", "the record's MAC does not match")
        return build_task_spec(app="a", name="t", num_instances=2, availability_timeout_s=300)

    def record(self) -> TaskRecord:
        raise SignatureError("tasks/t-1/task.json", "no record here")  # capguard: no deadline

    def outcome(self) -> Outcome | None:
        return None

    def instances(self) -> list[Instance]:
        return [Instance(f"i-{k}", self.task_id, "", "pending", self.launched_at,
                         market="slurm", instance_type="node", waiting=self.reason)
                for k in range(2)]

    def nodes(self) -> list[NodeRecord]:
        return []


def test_queued_nodes_are_provisioning_until_availability_timeout_then_failed() -> None:
    assert taskstate.judge(_Queued(time.time() - 10))[:2] == (TaskStatus.PROVISIONING, None)
    status, judged, _ = taskstate.judge(_Queued(time.time() - 400))
    assert status is TaskStatus.FAILED and judged is not None
    assert judged.label == "infra" and REASON in judged.message
    assert "longer than availability_timeout_s" in judged.message


def test_a_forged_record_never_makes_a_status_read_raise() -> None:
    assert taskstate.judge(_Queued(time.time() - 400, forged=True))[:2] == (
        TaskStatus.PROVISIONING, None)


def test_nodes_that_give_no_reason_never_read_the_record_for_it() -> None:
    task = _Queued(time.time() - 400, reason="", forged=True)
    assert taskstate.judge(task)[:2] == (TaskStatus.PROVISIONING, None)
    assert task.spec_reads == []
