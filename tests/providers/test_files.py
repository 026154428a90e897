from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from flow_sdk.errors import ProviderError
from flow_sdk.providers.base import LogRecord
from flow_sdk.providers.files import FileLogStore, FileObjectStore
from flow_sdk.providers.files import replace_file


def test_object_store_put_get_list_delete(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    assert store.get("a/b") is None
    store.put("a/b", b"1")
    store.put("a/c/d", b"2")
    store.put("z", b"3")
    assert store.get("a/b") == b"1"
    assert store.list("a/") == ["a/b", "a/c/d"]
    assert store.delete_prefix("a/") == 2
    assert store.list("a/") == [] and store.get("z") == b"3"


def test_put_if_absent_has_one_winner(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    assert store.put_if_absent("k", b"first") is True
    assert store.put_if_absent("k", b"second") is False
    assert store.get("k") == b"first"


@pytest.mark.parametrize("key", ["../x", "/abs", "a/../../b"])
def test_unsafe_keys_rejected(tmp_path: Path, key: str) -> None:
    with pytest.raises(ProviderError):
        FileObjectStore(tmp_path).put(key, b"")


def test_log_store_cursor_never_rereads_and_waits_for_whole_lines(tmp_path: Path) -> None:
    logs = FileLogStore(tmp_path)
    writer = logs.writer("t", "node-0.rank-0")
    writer.write([LogRecord(1.0, "one"), LogRecord(2.0, "two")])
    records, cursor = logs.read("t", "node-0.rank-0")
    assert [r.text for r in records] == ["one", "two"]
    path = tmp_path / "t" / "node-0.rank-0.log"
    with open(path, "ab") as fh:
        fh.write(b"3.0\thalf")  # a line still being written
    records, cursor2 = logs.read("t", "node-0.rank-0", cursor)
    assert records == [] and cursor2 == cursor
    with open(path, "ab") as fh:
        fh.write(b" done\n")
    records, _ = logs.read("t", "node-0.rank-0", cursor2)
    assert [r.text for r in records] == ["half done"]
    assert logs.streams("t") == ["node-0.rank-0"]
    writer.close()


@pytest.mark.slow
def test_a_local_tasks_store_logs_and_node_folders_are_the_users_alone(flow_home: Path) -> None:
    import stat

    from flow_testing import wait_until

    from flow_sdk import FlowApp

    app = FlowApp("private")

    @app.function(num_instances=2)
    def hello() -> str:
        import time
        print("hello", flush=True)
        time.sleep(2)  # the node folders are looked at while the task runs
        return "hi"

    task = hello.spawn()
    root = flow_home / "local"
    wait_until(lambda: sum("hello" in line for line in task.logs()) == 2, 90, "2 ranks")
    workdirs = list((root / "nodes" / task.task_id).iterdir())
    assert len(workdirs) == 2  # each holds the node's copy of the payload and its results
    for folder in [root / "nodes", root / "nodes" / task.task_id, *workdirs]:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert task.results(timeout=120) == ["hi", "hi"]
    assert stat.S_IMODE(flow_home.stat().st_mode) == 0o700
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    checked = 0
    for part in ("store", "logs"):  # every object, result, record and log line
        for path in [root / part, *(root / part).rglob("*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {oct(mode)}"
            checked += 1
    assert checked > 20
    assert len(list((root / "store").rglob("results/*"))) == 2


def _torn_reads(tmp_path: Path, write: Callable[[Path, str], object]) -> int:
    """Reads of a JSON record that another thread rewrites 1,000 times: how many saw it empty
    or half written."""
    tmp_path.mkdir()
    path = tmp_path / "i-0.json"
    path.write_text(json.dumps({"terminated": False, "pad": "x" * 4096}))
    done = threading.Event()

    def rewrite() -> None:
        for n in range(1000):
            write(path, json.dumps({"terminated": n % 2 == 0, "pad": "x" * 4096}))
        done.set()

    writer = threading.Thread(target=rewrite)
    writer.start()
    torn = 0
    while not done.is_set():
        try:
            json.loads(path.read_text())
        except ValueError:
            torn += 1
    writer.join()
    return torn


def test_a_rewritten_instance_record_is_never_read_half_written(tmp_path: Path) -> None:
    """``flow logs -f`` lists a task's nodes while ``cancel`` marks them terminated: the
    local provider replaces a record whole. A plain rewrite (truncate, then write) is read
    torn here, so the check has teeth."""
    assert _torn_reads(tmp_path / "replaced", replace_file) == 0
    assert _torn_reads(tmp_path / "rewritten", Path.write_text) > 0
