"""The availability clock starts when the first agent of the task is up, for every node."""

from __future__ import annotations

from pathlib import Path

from flow_sdk import wire
from flow_sdk.wire import signing
from flow_sdk.node.agent import clock
from flow_sdk.providers.files import FileObjectStore
from flow_sdk.spec import build_task_spec


def _store(root: Path, secret: bytes = b"k" * 32) -> signing.SignedStore:
    return signing.SignedStore(FileObjectStore(root), secret)


def test_a_late_node_gets_what_is_left_of_the_first_agents_clock(tmp_path: Path) -> None:
    store = _store(tmp_path)
    spec = build_task_spec(app="a", name="f", availability_timeout_s=300, boot_timeout_s=1200)
    # the first node comes up at t=1000 and its clock is the whole availability timeout
    clock.mark_up(store, "t-1", "i-a", 1000.0)
    assert clock.availability_deadline(store, "t-1", spec, 0, now=1000.0) == 1300.0
    # its peer's install took 60 s longer: it waits until the same deadline, not its own
    clock.mark_up(store, "t-1", "i-b", 1060.0)
    assert clock.availability_deadline(store, "t-1", spec, 0, now=1060.0) == 1300.0
    # a restarted agent keeps its first time
    clock.mark_up(store, "t-1", "i-a", 2000.0)
    assert clock.first_up(store, "t-1", default=5000.0) == 1000.0
    # what is left, with a grace to finish joining for a node that arrives at the deadline
    assert clock.remaining(1300.0, now=1100.0) == 200.0
    assert clock.remaining(1300.0, now=1400.0) == 0.0
    assert clock.remaining(1300.0, now=1299.0, floor=clock.JOIN_GRACE_S) == clock.JOIN_GRACE_S
    # a later generation waits for replacements, which boot first: both clocks, from now
    assert clock.availability_deadline(store, "t-1", spec, 1, now=3000.0) == 4500.0


def test_no_agent_up_yet_starts_the_clock_now_and_forged_records_do_not_count(
        tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert clock.first_up(store, "t-2", default=42.0) == 42.0
    forger = _store(tmp_path, secret=b"x" * 32)  # the store's contents, not the task's secret
    clock.mark_up(forger, "t-2", "i-evil", 1.0)
    assert store.list(wire.agents_up_prefix("t-2")) == [wire.agent_up_key("t-2",
                                                                                  "i-evil")]
    assert clock.first_up(store, "t-2", default=42.0) == 42.0
