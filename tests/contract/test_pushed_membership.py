"""Membership pushed, not polled, on every provider: the launcher writes the gang's signed
membership record once, and each node takes its rank from it without listing the provider's
instances (its agent log says where its membership came from)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from flow_testing import results_or_cancel
from contract_helpers import Contract

from flow_sdk import TaskStatus, tasksecrets, wire
from flow_sdk.wire import signing
from flow_sdk.wire import MembershipRecord


def _where_am_i() -> dict[str, Any]:
    return {"node": int(os.environ["FLOW_NODE_RANK"]), "leader": os.environ["MASTER_ADDR"]}


@pytest.mark.slow
def test_nodes_take_their_ranks_from_the_launchers_record(contract: Contract) -> None:
    task = contract.app("pushed").function(num_instances=2, priority="high")(
        _where_am_i).spawn()
    results = results_or_cancel(task, 180)
    assert task.status is TaskStatus.SUCCEEDED
    signed = signing.SignedStore(task.provider.store, tasksecrets.load_task_secret(task.task_id))
    raw = signed.get_record(wire.membership_key(task.task_id, 0))
    assert raw is not None
    members = sorted(MembershipRecord.from_json(raw).members, key=lambda m: m.instance_id)
    assert [r["node"] for r in results] == [0, 1]
    assert {r["leader"] for r in results} == {members[0].address}
    agent_lines = task.logs(source="agent")
    assert sum("membership of generation 0 from its record" in line
               for line in agent_lines) == 2
    assert not any("asking the provider" in line for line in agent_lines)
