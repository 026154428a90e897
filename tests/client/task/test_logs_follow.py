"""Logs: follow merges two nodes' lines in order within a second, loses none of 100,000, and
each node's boot output explains a node that died before user code; all after the nodes left."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from flow_testing import processes_with_env

from flow_sdk import FlowApp, Task, TaskStatus

pytestmark = pytest.mark.slow

app = FlowApp("logs-tests")
TICKS = 20
LINE_RE = re.compile(r"^\[Node (\d)\] \[\d\d:\d\d:\d\d\] tick (\d+) node (\d) at (\d+\.\d+)$")


@app.function(num_instances=2)
def ticker(go_dir: str, ticks: int) -> None:
    """Print 'ready', wait for the go file, then print on a shared schedule: node 0 at
    start + i*0.1 s, node 1 50 ms later, so the two nodes' lines interleave."""
    import os
    import time
    from pathlib import Path

    node = int(os.environ["FLOW_NODE_RANK"])
    print(f"ready {node}", flush=True)
    go = Path(go_dir) / "go"
    while not go.exists():
        time.sleep(0.01)
    start = float(go.read_text())
    for i in range(ticks):
        delay = start + i * 0.1 + node * 0.05 - time.time()
        if delay > 0:
            time.sleep(delay)
        print(f"tick {i} node {node} at {time.time():.6f}", flush=True)


@app.function(num_instances=2)
def flood(count: int) -> int:
    import os

    node = os.environ["FLOW_NODE_RANK"]
    for i in range(count):
        print(f"n{node} {i}")
    return count


@app.function(num_instances=1)
def never_runs() -> str:
    return "unreachable: the agent dies while importing"


def test_follow_merges_two_nodes_in_order_labelled_within_one_second(tmp_path: Path) -> None:
    task = ticker.spawn(str(tmp_path), TICKS)
    ready: set[str] = set()
    received: list[tuple[float, str]] = []
    for line in task.logs(follow=True):
        now = time.time()
        if " ready " in line:
            ready.add(line)
            if len(ready) == 2:  # both nodes listen: start the schedule half a second out
                (tmp_path / "go.tmp").write_text(f"{time.time() + 0.5:.6f}")
                os.replace(tmp_path / "go.tmp", tmp_path / "go")
        else:
            received.append((now, line))
    assert task.wait() is TaskStatus.SUCCEEDED
    assert len(received) == 2 * TICKS, received
    printed_at, lines = [], set()
    for arrived, line in received:
        match = LINE_RE.match(line)
        assert match, line
        label_node, tick, node, printed = match.groups()
        assert label_node == node  # each line carries its own node's label
        assert arrived - float(printed) < 1.0, f"{line!r} arrived {arrived - float(printed):.3f}s late"
        printed_at.append(float(printed))
        lines.add((int(tick), int(node)))
    assert lines == {(i, n) for i in range(TICKS) for n in (0, 1)}
    # In the order printed: no line comes after one printed more than 20 ms later. (The
    # schedule puts 50 ms between the nodes' lines; on a busy machine a node may print late,
    # and then its line belongs after the other's.)
    early = [line for k, (_, line) in enumerate(received)
             if max(printed_at[:k + 1]) > printed_at[k] + 0.02]
    assert early == [], received


def test_follow_delivers_100000_lines_with_none_lost() -> None:
    per_node = 50_000
    task = flood.spawn(per_node)
    start = time.monotonic()
    seen: dict[str, list[int]] = {"0": [], "1": []}
    for line in task.logs(follow=True):
        head, _, text = line.partition("] ")  # "[Node i" | "[HH:MM:SS] n<i> <k>"
        node_text, number = text.split("] ", 1)[1].split()
        assert head == f"[Node {node_text[1:]}"
        seen[node_text[1:]].append(int(number))
    elapsed = time.monotonic() - start
    assert task.result() == per_node
    for node in ("0", "1"):
        assert seen[node] == list(range(per_node)), f"node {node}: lines lost or reordered"
    assert len(task.logs()) == 2 * per_node  # and all of them stay readable afterwards
    print(f"100,000 lines followed in {elapsed:.2f}s")


def test_boot_log_explains_a_node_that_died_before_user_code(
        flow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "broken-site"
    broken.mkdir()
    (broken / "cloudpickle.py").write_text(
        'raise ImportError("cloudpickle is broken on this node (test)")\n')
    monkeypatch.setenv("PYTHONPATH", str(broken))  # node processes only: this one has it loaded
    task = never_runs.spawn()
    assert task.wait(timeout=60) is TaskStatus.FAILED
    assert processes_with_env("FLOW_HOME", str(flow_home)) == []  # the node is gone
    outcome = task.outcome()
    assert outcome is not None and "cloudpickle is broken on this node" in outcome.message
    assert "last boot output" in outcome.message
    assert task.logs(source="agent") == []  # the agent never got as far as logging
    boot = task.logs(node=0, source="boot")
    assert any(re.match(r"^\[Node 0\] \[\d\d:\d\d:\d\d\] \[boot\] ImportError: cloudpickle is "
                        r"broken on this node", line) for line in boot), boot
    assert any("Traceback (most recent call last)" in line for line in boot)
    assert set(boot) <= set(task.logs(source="all"))


def test_logs_reject_an_unknown_source() -> None:
    task = Task("no-such-task", app.provider())
    with pytest.raises(ValueError, match="workers, agent, boot, all"):
        task.logs(source="everything")  # type: ignore[call-overload]
