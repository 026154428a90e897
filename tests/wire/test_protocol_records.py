"""Node phases, node events, stream kinds and task states are named once, in the protocol, and
records read back from a store are checked against them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flow_sdk import wire
from flow_sdk.home import tasksecrets
from flow_sdk.wire import signing
from flow_sdk.errors import FlowError, RecordError
from flow_sdk.wire import (
    NODE_PHASES,
    STREAM_KINDS,
    TERMINAL_STATUSES,
    GangMember,
    MembershipRecord,
    NodePhase,
    NodeRecord,
    Outcome,
    StreamKind,
    TaskRecord,
    TaskStatus,
)
from flow_sdk.providers.local import LocalProvider
from flow_sdk.client.task import Task


def test_the_allowed_values_are_the_enums_values() -> None:
    assert NODE_PHASES == ("rendezvous", "running", "restarting", "done", "failed",
                           "cancelled")
    assert STREAM_KINDS == ("node", "agent", "boot")
    assert TERMINAL_STATUSES == ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")
    assert all(TaskStatus(s).is_terminal for s in TERMINAL_STATUSES)
    assert {str(NodePhase.RESTARTING), str(StreamKind.BOOT)} == {"restarting", "boot"}


def test_stream_kinds_match_the_stream_names() -> None:
    assert wire.rank_stream(1, 2).startswith(f"{StreamKind.NODE}-")
    assert wire.agent_stream("i-1").partition(".")[0] == StreamKind.AGENT


@pytest.mark.parametrize("phase", list(NodePhase))
def test_a_node_record_round_trips_every_phase(phase: NodePhase) -> None:
    record = NodeRecord(2, "i-1", "127.0.0.2", phase, 1.5, workers=4,
                        activity="importing your code")
    data = wire.to_json(record)
    assert json.loads(data)["phase"] == phase.value
    back = NodeRecord.from_json(data)
    assert back == record and back.phase is phase


def _node_json(**changes: object) -> bytes:
    raw = {"node": 0, "instance_id": "i-1", "address": "127.0.0.2", "phase": "running",
           "updated_at": 1.0, "workers": 1}
    raw.update(changes)
    return json.dumps(raw).encode()


@pytest.mark.parametrize(("data", "words"), [
    (_node_json(phase="sleeping"), "NodeRecord.phase is 'sleeping'"),
    (_node_json(phase=3), "NodeRecord.phase is 3"),
    (_node_json(colour="red"), "unknown fields ['colour']"),
    (_node_json(activity="sleeping"), "NodeRecord.activity is 'sleeping'"),
    (_node_json(activity=0), "NodeRecord.activity is 0"),
    (b'{"node": 0}', "missing fields ['address', 'instance_id', 'phase', 'updated_at']"),
    (b"[1, 2]", "expected a JSON object"),
    (b"\xff not json", "not JSON"),
])
def test_a_bad_node_record_is_a_typed_error(data: bytes, words: str) -> None:
    with pytest.raises(RecordError, match=r"same flow-sdk version|JSON object") as info:
        NodeRecord.from_json(data)
    assert words in str(info.value)
    assert isinstance(info.value, FlowError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("status", TERMINAL_STATUSES)
def test_an_outcome_round_trips_every_terminal_status(status: str) -> None:
    outcome = Outcome(status, "m", 2.0, node=1, rank=3, exit_code=1, log_tail=["x"])
    assert Outcome.from_json(wire.to_json(outcome)) == outcome


@pytest.mark.parametrize("status", ["RUNNING", "PENDING", "ok", None])
def test_an_outcome_with_a_status_that_does_not_end_a_task_is_a_typed_error(
        status: object) -> None:
    data = json.dumps({"status": status, "message": "m", "finished_at": 1.0}).encode()
    with pytest.raises(RecordError, match=f"Outcome.status is {status!r}"):
        Outcome.from_json(data)


def test_a_task_record_with_unknown_fields_is_a_typed_error() -> None:
    record = TaskRecord("t-1", {"name": "fn"}, "d" * 64, 1.0, 1, 2)
    assert TaskRecord.from_json(wire.to_json(record)) == record
    raw = json.loads(wire.to_json(record))
    raw["extra"] = 1
    with pytest.raises(RecordError, match=r"TaskRecord: unknown fields \['extra'\]"):
        TaskRecord.from_json(json.dumps(raw).encode())


def test_a_membership_record_round_trips_and_refuses_bad_members() -> None:
    record = MembershipRecord(3, [GangMember("i-b", "10.0.0.2"), GangMember("i-a", "10.0.0.1")],
                              1.5)
    assert MembershipRecord.from_json(wire.to_json(record)) == record
    for members in ([{"instance_id": "i-a"}], [{"instance_id": "i-a", "address": 7}], "i-a"):
        raw = {"generation": 0, "members": members, "written_at": 1.0}
        with pytest.raises(RecordError, match="MembershipRecord.members"):
            MembershipRecord.from_json(json.dumps(raw).encode())


def test_a_task_reads_store_records_through_the_checks(tmp_path: Path, flow_home: Path
                                                       ) -> None:
    provider = LocalProvider(tmp_path / "local", ssh=False)
    tasksecrets.save_task_secret("t-1", signing.new_secret())  # as launch_task does
    task = Task("t-1", provider)
    task.store.put_record(wire.node_key("t-1", 0),
                          NodeRecord(0, "i-1", "127.0.0.2", NodePhase.RESTARTING, 1.0))
    assert [n.phase for n in task.nodes()] == [NodePhase.RESTARTING]
    task.store.put_record(wire.node_key("t-1", 1),
                          json.loads(_node_json(node=1, phase="sleeping")))
    with pytest.raises(RecordError, match="'sleeping'"):
        task.nodes()
    task.store.put_record(wire.outcome_key("t-1"),
                          {"status": "RUNNING", "message": "m", "finished_at": 1.0})
    with pytest.raises(RecordError, match="Outcome.status is 'RUNNING'"):
        task.outcome()
