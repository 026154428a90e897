"""Task timelines: strict record parsing, reading them from a store, drawing them as text."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from flow_sdk.client.timeline import (
    Timeline,
    phase_durations,
    render,
    task_timeline,
)
from flow_sdk.errors import RecordError, SignatureError
from flow_sdk.providers.base import Instance
from flow_sdk.providers.files import FileObjectStore
from flow_sdk.wire import LaunchedNode, LaunchRecord, TaskRecord, launch_key
from flow_sdk.wire.signing import SignedStore
from flow_sdk.wire.timeline import (
    PHASES,
    NodeTimeline,
    generation_phase,
    is_phase,
    timeline_key,
    timeline_prefix,
)

SECRET = b"s" * 32


def _json(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_keys_live_under_the_task_and_phase_names_are_fixed() -> None:
    assert timeline_prefix("t-1") == "tasks/t-1/timeline/"
    assert timeline_key("t-1", "i-a") == "tasks/t-1/timeline/i-a.json"
    assert PHASES[0] == "requested" and PHASES[-1] == "end"
    assert is_phase("generation_3") and generation_phase(2) == "generation_2"
    assert not is_phase("generation_0") and not is_phase("generation_x")
    with pytest.raises(ValueError):
        generation_phase(0)


def test_a_record_round_trips_and_the_mac_field_is_ignored() -> None:
    raw = _json(instance_id="i-a", node=1, phases={"agent_up": 5, "generation_2": 7.5},
                mac="00")
    assert NodeTimeline.from_json(raw) == NodeTimeline("i-a", 1, {"agent_up": 5.0,
                                                                  "generation_2": 7.5})
    assert NodeTimeline.from_json(_json(instance_id="i-a", node=None, phases={})).node is None


@pytest.mark.parametrize("raw", [
    b"not json",
    b"[1, 2]",
    _json(instance_id="i-a", node=0),  # missing phases
    _json(instance_id="i-a", node=0, phases={}, extra=1),
    _json(instance_id="i-a", node=0, phases={"booting": 1.0}),
    _json(instance_id="i-a", node=0, phases={"generation_0": 1.0}),
    _json(instance_id="i-a", node=0, phases={"end": "soon"}),
    _json(instance_id="i-a", node=0, phases={"end": True}),
    _json(instance_id="i-a", node=0, phases=[1, 2]),
    _json(instance_id="i-a", node="0", phases={}),
    _json(instance_id="i-a", node=-1, phases={}),
    _json(instance_id=7, node=0, phases={}),
    b'{"instance_id": "i-a", "node": 0, "phases": {"end": NaN}}',
], ids=lambda raw: raw.decode()[:60])
def test_records_of_an_unknown_shape_are_refused(raw: bytes) -> None:
    with pytest.raises(RecordError):
        NodeTimeline.from_json(raw)


def _timeline() -> Timeline:
    local = NodeTimeline("i-a", 0, {
        "requested": 1000.0, "instance_running": 1002.0, "agent_up": 1004.0, "joined": 1005.0,
        "barrier_released": 1006.0, "first_worker_line": 1007.0, "end": 1010.0})
    booted = NodeTimeline("i-0123456789abcdef0", 1, {
        "instance_running": 1001.0, "boot_started": 1002.0, "code_installed": 1004.0,
        "agent_up": 1005.0, "joined": 1006.0, "barrier_released": 1006.0,
        "first_worker_line": 1008.0, "generation_1": 1009.0, "end": 1010.0})
    waiting = NodeTimeline("i-c", None, {"instance_running": 1003.0})
    return Timeline("t-1", 1000.0, [waiting, booted, local])


def test_render_draws_one_bar_per_node_a_legend_and_the_table() -> None:
    lines = render(_timeline(), width=10).splitlines()
    assert lines[0] == "task t-1: 3 nodes, 10.0s from the request to the last phase seen"
    assert lines[1] == "node 0   i-a           |iiaajrw===|  total 10.0s"
    assert lines[2] == "node 1   i-012345678…  |ibccajwwg=|  total 10.0s"
    assert lines[3] == "node ?   i-c           |iii       |  so far 3.0s"
    assert lines[5] == ("legend (each segment ends at its phase): i instance_running  "
                        "b boot_started  c code_installed  a agent_up  j joined  "
                        "r barrier_released  w first_worker_line  g generation_<n>  = end")
    table = lines[7:]
    assert table[0].split() == ["seconds", "since", "previous", "node", "0", "node", "1",
                                "node", "?"]
    rows = {row.split()[0]: row.split()[1:] for row in table[1:]}
    assert rows["instance_running"] == ["2.00", "1.00", "3.00"]
    assert rows["boot_started"] == ["-", "1.00", "-"]
    assert rows["agent_up"] == ["2.00", "1.00", "-"]
    assert rows["generation_1"] == ["-", "1.00", "-"]
    assert rows["end"] == ["3.00", "1.00", "-"]
    assert list(rows)[-2:] == ["generation_1", "end"]


def test_render_of_nothing_yet_and_of_a_clock_that_went_back() -> None:
    assert render(Timeline("t-1", 5.0, [])) == "task t-1: no node timeline yet"
    skewed = Timeline("t-1", 100.0, [NodeTimeline("i-a", 0, {"agent_up": 99.0, "end": 104.0})])
    assert render(skewed, width=4).splitlines()[1] == "node 0   i-a           |====|  total 4.0s"


def test_phase_durations_are_per_phase_in_order_each_nodes_seconds() -> None:
    durations = phase_durations(_timeline())
    assert list(durations) == ["instance_running", "boot_started", "code_installed",
                               "agent_up", "joined", "barrier_released", "first_worker_line",
                               "generation_1", "end"]
    assert durations["instance_running"] == [2.0, 1.0, 3.0]  # node 0, node 1, unranked
    assert durations["barrier_released"] == [1.0, 0.0]
    assert durations["end"] == [3.0, 1.0]


@dataclass
class _Task:
    task_id: str
    store: SignedStore
    launched: list[Instance]

    def record(self) -> TaskRecord:
        return TaskRecord(self.task_id, {}, "d" * 64, 1000.0, 1, 2)

    def instances(self) -> list[Instance]:
        return self.launched


def _instance(instance_id: str, launched_at: float) -> Instance:
    return Instance(instance_id, "t-1", "127.0.0.2", "running", launched_at, market="local",
                    instance_type="local")


def _task(root: Path) -> _Task:
    store = SignedStore(FileObjectStore(root), SECRET)
    return _Task("t-1", store, [_instance("i-a", 1002.0), _instance("i-b", 990.0)])


def test_task_timeline_merges_the_request_and_the_launch_into_the_records(
        tmp_path: Path) -> None:
    task = _task(tmp_path)
    task.store.put_record(timeline_key("t-1", "i-a"),
                          NodeTimeline("i-a", 0, {"agent_up": 1004.0, "end": 1010.0}))
    # the provider no longer lists i-gone: its launch record's time stands in
    task.store.put_record(launch_key("t-1"), LaunchRecord(1001.5, [
        LaunchedNode(n, "local", "local", 0.0) for n in ("i-a", "i-gone")]))
    found = task_timeline(task)
    assert found.task_id == "t-1" and found.requested_at == 1000.0
    assert found.nodes == [
        NodeTimeline("i-a", 0, {"agent_up": 1004.0, "end": 1010.0, "requested": 1000.0,
                                "instance_running": 1002.0}),
        # no record yet; a warm node that ran before the request is running from it
        NodeTimeline("i-b", None, {"requested": 1000.0, "instance_running": 1000.0}),
        NodeTimeline("i-gone", None, {"requested": 1000.0, "instance_running": 1001.5})]
    assert found.as_dict()["durations"]["agent_up"] == [2.0]


def test_a_forged_or_misplaced_record_raises(tmp_path: Path) -> None:
    task = _task(tmp_path)
    forger = SignedStore(FileObjectStore(tmp_path), b"x" * 32)
    forger.put_record(timeline_key("t-1", "i-a"), NodeTimeline("i-a", 0, {"end": 1.0}))
    with pytest.raises(SignatureError):
        task_timeline(task)
    task.store.put_record(timeline_key("t-1", "i-a"), NodeTimeline("i-b", 0, {"end": 1.0}))
    with pytest.raises(RecordError, match="holds the record of i-b"):
        task_timeline(task)


def test_flow_timeline_prints_the_bars_or_json(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from flow_sdk.cli import diagnose, main

    task = _task(tmp_path)
    task.store.put_record(timeline_key("t-1", "i-a"), NodeTimeline("i-a", 0, {"end": 1010.0}))
    monkeypatch.setattr(diagnose, "find_task", lambda ref: task)
    shown = CliRunner().invoke(main, ["timeline", "t-1", "--width", "20"])
    assert shown.exit_code == 0, shown.output
    assert "node 0   i-a           |" in shown.output and "total 10.0s" in shown.output
    data = json.loads(CliRunner().invoke(main, ["timeline", "t-1", "--json"]).output)
    assert data["nodes"][0]["phases"]["end"] == 1010.0
    assert data["durations"]["end"] == [8.0]
