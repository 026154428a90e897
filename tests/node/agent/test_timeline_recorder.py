"""A node's timeline record: first time of each phase, signed, and never a reason to crash."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from flow_sdk.errors import FlowError
from flow_sdk.node.agent.timeline import TimelineRecorder, read_boot_phases
from flow_sdk.providers.files import FileObjectStore
from flow_sdk.wire.signing import SignedStore
from flow_sdk.wire.timeline import NodeTimeline, timeline_key

SECRET = b"k" * 32


def _store(root: Path, secret: bytes = SECRET) -> SignedStore:
    return SignedStore(FileObjectStore(root), secret)


def _read(store: SignedStore, instance_id: str = "i-a") -> NodeTimeline:
    raw = store.get_record(timeline_key("t-1", instance_id))
    assert raw is not None
    return NodeTimeline.from_json(raw)


def test_each_phase_keeps_its_first_time_and_the_record_is_signed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    lines: list[str] = []
    recorder = TimelineRecorder(store, "t-1", "i-a", log=lines.append)
    recorder.mark("agent_up", at=10.0)
    assert _read(store) == NodeTimeline("i-a", None, {"agent_up": 10.0})
    recorder.set_node(2)
    recorder.mark("joined", at=11.0)
    recorder.mark("agent_up", at=99.0)  # later marks of a phase are ignored
    recorder.mark("generation_1")  # now
    found = _read(store)
    assert found.node == 2
    assert found.phases["agent_up"] == 10.0 and found.phases["joined"] == 11.0
    assert found.phases["generation_1"] > 11.0
    assert recorder.snapshot() == found
    assert lines == []
    with pytest.raises(ValueError, match="unknown timeline phase"):
        recorder.mark("booting")
    with pytest.raises(FlowError):  # signed with the task's secret: another secret refuses it
        _store(tmp_path, b"x" * 32).get_record(timeline_key("t-1", "i-a"))


def test_marks_from_several_threads_lose_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    recorder = TimelineRecorder(store, "t-1", "i-a", log=print)
    phases = [f"generation_{n}" for n in range(1, 9)]
    threads = [threading.Thread(target=recorder.mark, args=(p, float(i)))
               for i, p in enumerate(phases)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert _read(store).phases == {p: float(i) for i, p in enumerate(phases)}


class _BrokenStore:
    """An object store whose writes fail, as a full disk or a lost network would."""

    def get(self, key: str) -> bytes | None:
        return None

    def put(self, key: str, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    def put_if_absent(self, key: str, data: bytes) -> bool:
        raise OSError(28, "No space left on device")

    def list(self, prefix: str) -> list[str]:
        return []


def test_a_write_that_fails_is_logged_and_the_agent_goes_on() -> None:
    lines: list[str] = []
    recorder = TimelineRecorder(SignedStore(_BrokenStore(), SECRET), "t-1", "i-a",
                                log=lines.append)
    recorder.mark("agent_up", at=1.0)
    recorder.mark("joined", at=2.0)
    assert len(lines) == 2 and "No space left on device" in lines[0]
    assert lines[0].startswith("could not write the node's timeline record "
                               "tasks/t-1/timeline/i-a.json")
    assert recorder.snapshot().phases == {"agent_up": 1.0, "joined": 2.0}


def test_the_bootstrap_stamps_are_read_first_time_wins(tmp_path: Path) -> None:
    stamps = tmp_path / ".boot-phases"
    assert read_boot_phases(stamps) == {}
    stamps.write_text("boot_started 1700000000.123456789\n"
                      "garbage\n"
                      "code_installed not-a-time\n"
                      "unknown_phase 5\n"
                      "code_installed 1700000004.5\n"
                      "boot_started 1800000000\n"
                      "end nan\n")
    assert read_boot_phases(stamps) == {"boot_started": 1700000000.123456789,
                                        "code_installed": 1700000004.5}
    store = _store(tmp_path / "store")
    recorder = TimelineRecorder(store, "t-1", "i-a", log=print)
    recorder.mark("boot_started", at=1.0)  # marked already: kept
    recorder.mark_boot_phases(stamps)
    recorder.mark_boot_phases(tmp_path / "missing")  # nothing to add, nothing written
    assert _read(store).phases == {"boot_started": 1.0, "code_installed": 1700000004.5}


def test_a_stamp_file_that_cannot_be_read_is_logged(tmp_path: Path) -> None:
    lines: list[str] = []
    recorder = TimelineRecorder(_store(tmp_path), "t-1", "i-a", log=lines.append)
    (tmp_path / "a-file").write_text("")
    recorder.mark_boot_phases(tmp_path / "a-file" / "y")  # a file where a folder should be
    recorder.mark_boot_phases(tmp_path)  # a folder
    assert lines == [] and recorder.snapshot().phases == {}
    recorder.mark_boot_phases(tmp_path / ("x" * 300))  # a name too long: OSError
    assert len(lines) == 1 and lines[0].startswith("could not read the bootstrap's phases")
    assert recorder.snapshot().phases == {}
