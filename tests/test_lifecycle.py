"""One owner of a task's end: only ``flow_sdk/lifecycle.py`` writes a task's outcome record
(a scan of the package keeps it so, and a scratch write elsewhere fails the scan), the first
valid record wins, reading a status writes nothing, and ``wait`` records the judged outcome
of a task whose nodes all vanished."""

from __future__ import annotations

import ast
import os
import shutil
import signal
from pathlib import Path

import pytest
from flow_testing import agent_pid, wait_until

from flow_sdk import FlowApp, TaskStatus, lifecycle, wire
from flow_sdk.home import tasksecrets
from flow_sdk.wire import signing
from flow_sdk.errors import TaskFailedError
from flow_sdk.wire import Outcome
from flow_sdk.providers.base import SchedulerEnd
from flow_sdk.providers.local import LocalProvider

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "flow_sdk"
OWNER = PACKAGE / "lifecycle.py"
WRITES = {"put", "put_if_absent", "put_record", "put_record_if_absent", "put_blob"}

app = FlowApp("lifecycle-tests")


@app.function(num_instances=2)
def sleeps(seconds: float) -> None:
    import time

    time.sleep(seconds)


def _is_outcome_key(node: ast.AST, bound: set[str]) -> bool:
    """``outcome_key(...)`` / ``wire.outcome_key(...)`` (also bound in place with ``:=``),
    or a name bound to one."""
    if isinstance(node, ast.NamedExpr):
        return _is_outcome_key(node.value, bound)
    if isinstance(node, ast.Name):
        return node.id in bound
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "outcome_key") or \
        (isinstance(func, ast.Attribute) and func.attr == "outcome_key")


def outcome_writes(path: Path) -> list[int]:
    """Lines of ``path`` that write to the outcome key: a store write (``put``,
    ``put_record_if_absent``, ...) whose key is ``outcome_key(...)`` or a name bound to it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bound = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
             and _is_outcome_key(node.value, set())
             for target in node.targets if isinstance(target, ast.Name)}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in WRITES and node.args and _is_outcome_key(node.args[0], bound)]


def writers(root: Path) -> dict[str, list[int]]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        lines = outcome_writes(path)
        if lines:
            found[str(path.relative_to(root))] = lines
    return found


def test_only_the_lifecycle_module_writes_outcome_records() -> None:
    assert list(writers(PACKAGE)) == ["lifecycle.py"]


def test_a_scratch_outcome_write_outside_lifecycle_fails_the_scan(tmp_path: Path) -> None:
    """The scan has teeth: a copy of the package whose client/task.py writes the outcome key
    (directly, or through a name bound to it) names client/task.py."""
    copy = tmp_path / "flow_sdk"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert list(writers(copy)) == ["lifecycle.py"]
    task = copy / "client" / "task.py"
    clean = task.read_text(encoding="utf-8")
    task.write_text(clean + "\n\ndef _scratch(store, task_id, outcome):\n"
                    "    store.put_record_if_absent(wire.outcome_key(task_id), outcome)\n")
    assert list(writers(copy)) == ["client/task.py", "lifecycle.py"]
    task.write_text(clean + "\n\ndef _scratch(store, task_id, raw):\n"
                    "    key = wire.outcome_key(task_id)\n    store.put(key, raw)\n")
    assert list(writers(copy)) == ["client/task.py", "lifecycle.py"]


def outcome_key_users(root: Path) -> list[str]:
    """The modules under ``root`` that name the outcome key (``outcome_key``: a name, an
    attribute or an imported name), outside ``lifecycle.py`` and the wire layer."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] == "wire" or rel == Path("lifecycle.py"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.Name) and node.id == "outcome_key"
               or isinstance(node, ast.Attribute) and node.attr == "outcome_key"
               or isinstance(node, ast.alias) and node.name == "outcome_key"
               for node in ast.walk(tree)):
            found.append(str(rel))
    return found


def test_no_module_outside_lifecycle_and_wire_names_the_outcome_key(tmp_path: Path) -> None:
    """Reading or writing a task's outcome goes through ``lifecycle`` (which checks its
    seal); a scratch module that names the key fails the scan."""
    assert outcome_key_users(PACKAGE) == []
    (tmp_path / "wire").mkdir()
    (tmp_path / "wire" / "keys.py").write_text("def outcome_key(task_id): ...\n")
    (tmp_path / "lifecycle.py").write_text("from flow_sdk.wire import outcome_key\n")
    (tmp_path / "reader.py").write_text("def peek(store, wire, t):\n"
                                        "    return store.get(wire.outcome_key(t))\n")
    (tmp_path / "importer.py").write_text("from flow_sdk.wire.keys import outcome_key\n")
    assert outcome_key_users(tmp_path) == ["importer.py", "reader.py"]


def test_the_first_valid_outcome_wins_and_a_forgery_never_blocks_the_real_one() -> None:
    provider = LocalProvider()
    tasksecrets.save_task_secret("t-1", signing.new_secret())
    store = signing.SignedStore(provider.store, tasksecrets.load_task_secret("t-1"))
    assert lifecycle.outcome_of(store, "t-1") is None
    assert lifecycle.record_outcome(store, "t-1", lifecycle.cancelled_by_caller(now=1.0))
    assert not lifecycle.record_outcome(store, "t-1", Outcome("SUCCEEDED", "late", 2.0))
    outcome = lifecycle.outcome_of(store, "t-1")
    assert outcome is not None and (outcome.status, outcome.finished_at) == ("CANCELLED", 1.0)
    provider.store.put(wire.outcome_key("t-2"), wire.to_json(
        Outcome("SUCCEEDED", "forged", 3.0)))
    tasksecrets.save_task_secret("t-2", signing.new_secret())
    forged = signing.SignedStore(provider.store, tasksecrets.load_task_secret("t-2"))
    assert lifecycle.outcome_of(forged, "t-2") is None  # passed over, never the outcome
    assert lifecycle.record_outcome(forged, "t-2", Outcome("SUCCEEDED", "real", 4.0))
    real = lifecycle.outcome_of(forged, "t-2")  # the forgery did not block the real one
    assert real is not None and real.message == "real"
    assert provider.store.get(wire.outcome_key("t-2", 1)) is not None
    for slot in range(40):  # however many slots are forged, the real one goes past them
        provider.store.put(wire.outcome_key("t-3", slot), b'{"mac": "00"}')
    assert lifecycle.record_outcome(forged, "t-3", Outcome("SUCCEEDED", "real", 4.0))
    real = lifecycle.outcome_of(forged, "t-3")
    assert real is not None and real.message == "real"
    assert provider.store.get(wire.outcome_key("t-3", 40)) is not None


def test_the_vanished_nodes_judgement_names_where_they_died() -> None:
    crashed = lifecycle.nodes_vanished(["agent: boom"], ["boot: fine"], now=5.0)
    assert crashed.status == "FAILED" and crashed.log_tail == ["agent: boom"]
    assert crashed.message.startswith("every node exited without reporting an outcome")
    assert "last agent lines:\n  agent: boom" in crashed.message
    in_boot = lifecycle.nodes_vanished([], ["pip: no such package"], now=5.0)
    assert in_boot.message.startswith("every node exited in boot")
    assert "last boot output:\n  pip: no such package" in in_boot.message
    assert lifecycle.nodes_vanished([], [], now=5.0).log_tail == []
    # what the provider's scheduler says ended them leads, with the agents' lines after it
    failed = lifecycle.nodes_vanished(["agent: stop"], [], SchedulerEnd("job 3 ended NODE_FAIL"))
    assert failed.status == "FAILED" and failed.label == "infra"
    assert failed.message.startswith("job 3 ended NODE_FAIL; last agent lines:\n  agent: stop")
    cancelled = lifecycle.nodes_vanished([], [], SchedulerEnd("job 3 was cancelled", True))
    assert cancelled.status == "CANCELLED" and cancelled.message == "job 3 was cancelled"


def test_reading_a_vanished_tasks_status_writes_nothing_and_wait_records_it() -> None:
    task = sleeps.spawn(300.0)
    provider = task.provider
    assert isinstance(provider, LocalProvider)
    wait_until(lambda: len(provider.live_pids(task.task_id)) == 2, 60, "both agents up")
    for instance in provider.list_instances(task.task_id):
        os.kill(agent_pid(provider, task.task_id, instance.instance_id), signal.SIGKILL)
    wait_until(lambda: all(i.state == "terminated"
                           for i in provider.list_instances(task.task_id)), 60, "nodes gone")
    assert task.status is TaskStatus.FAILED
    assert task.outcome() is None  # a read recorded nothing
    judged = task.final_outcome()
    assert judged is not None and "every node exited" in judged.message
    assert task.wait(timeout=60) is TaskStatus.FAILED
    recorded = task.outcome()
    assert recorded is not None and recorded.message.startswith("every node exited")
    with pytest.raises(TaskFailedError, match="every node exited"):
        task.result(timeout=10)
