"""Every ``flow`` command through the installed console script, in a subprocess, on the local
provider: run, status, list, logs, ssh, cancel, plan, gc, and what their exit codes mean."""

from __future__ import annotations

import json
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from flow_testing import fake_aws_environment, processes_with_env, run_on_terminal, wait_until

from flow_sdk import Task, TaskStatus
from flow_sdk.client.records import list_client_records

pytestmark = pytest.mark.slow

_BESIDE = Path(sys.executable).with_name("flow")
FLOW = str(_BESIDE) if _BESIDE.exists() else (shutil.which("flow") or "flow")

HELLO = """
import os, sys
print(f"argv={sys.argv[1:]} rank={os.environ['RANK']} mark={os.environ['MARK']}", flush=True)
"""
FAILS = """
print("about to fail", flush=True)
raise RuntimeError("boom from the script")
"""
SLEEPS = """
import time
print("up", flush=True)
time.sleep(300)
"""


@pytest.fixture(autouse=True)
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This folder's conftest gives every test a fresh moto world (a moto server, reset per
    test); no command here talks to it: they launch on the local provider, or only plan for
    aws. They keep its fake credentials, so nothing can reach a real account."""
    fake_aws_environment(monkeypatch, tmp_path)


def flow(*args: str, timeout: float = 120, stdin: str | None = None
         ) -> subprocess.CompletedProcess[str]:
    assert shutil.which(FLOW), "the flow console script is not installed (pip install -e .)"
    return subprocess.run([FLOW, *args], capture_output=True, text=True, timeout=timeout,
                          check=False, input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)


def script(folder: Path, name: str, body: str) -> str:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def running(task_id: str, nodes: int) -> Task:
    task = Task.from_id(task_id)
    wait_until(lambda: len(task.nodes()) == nodes and all(n.phase == "running"
                                                          for n in task.nodes()),
               60, f"{nodes} node(s) of {task_id} to run")
    return task


def test_help_lists_exit_codes_and_bad_usage_exits_2(tmp_path: Path) -> None:
    helped = flow("--help")
    assert helped.returncode == 0
    for text in ("Exit codes", "130", "run", "status", "list", "logs", "ssh", "cancel", "plan",
                 "gc"):
        assert text in helped.stdout
    path = script(tmp_path, "hello.py", HELLO)
    invalid = flow("run", "--num-instances", "0", path)
    assert invalid.returncode == 2 and "--num-instances" in invalid.stderr
    assert flow("run", "--env", "NOEQUALS", path).returncode == 2
    unknown = flow("status", "no-such-task")
    assert unknown.returncode == 2 and "no task" in unknown.stderr
    assert flow("logs").returncode == 2
    assert list_client_records() == []  # nothing was launched


def test_run_on_two_nodes_then_status_list_and_logs(tmp_path: Path) -> None:
    path = script(tmp_path, "hello.py", HELLO)
    ran = flow("run", "-N", "2", "--workers-per-node", "2", "--env", "MARK=cli", path,
               "--lr", "0.1")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert len(lines) == 4, ran.stdout
    for rank in range(4):
        assert any(ln.startswith(f"[Node {rank // 2}] [") and f"[rank {rank}] argv=['--lr', "
                   f"'0.1'] rank={rank} mark=cli" in ln for ln in lines), lines
    assert "provisioning: " in ran.stderr and "running on 2 node(s)" in ran.stderr
    assert "SUCCEEDED" in ran.stderr

    listed = flow("list", "--json")
    assert listed.returncode == 0
    [entry] = json.loads(listed.stdout)
    task_id = entry["task_id"]
    assert (entry["name"], entry["status"], entry["nodes"]) == ("hello", "SUCCEEDED", 2)
    assert task_id in flow("list").stdout

    shown = flow("status", "--json")  # the newest task
    assert shown.returncode == 0
    data = json.loads(shown.stdout)
    assert data["task_id"] == task_id and data["status"] == "SUCCEEDED"
    assert [n["node"] for n in data["nodes"]] == [0, 1]
    assert "SUCCEEDED" in flow("status", task_id[:12]).stdout  # a unique prefix will do

    tail = flow("logs", task_id, "--node", "1", "--tail", "1")
    assert tail.returncode == 0
    assert len(tail.stdout.splitlines()) == 1 and tail.stdout.startswith("[Node 1] [")
    boot = flow("logs", task_id, "--source", "boot", "--node", "0")
    assert "[boot]" in boot.stdout and "agent started" in boot.stdout


def test_failing_script_exits_1_and_status_says_failed(tmp_path: Path) -> None:
    ran = flow("run", script(tmp_path, "fails.py", FAILS))
    assert ran.returncode == 1
    assert "about to fail" in ran.stdout and "Traceback" not in ran.stdout
    # Reported once, at the user's own file, without the SDK's frames.
    assert ran.stderr.count("RuntimeError: boom from the script") == 1, ran.stderr
    assert f'File "{tmp_path / "fails.py"}", line 3, in <module>' in ran.stderr, ran.stderr
    assert "flow_sdk" not in ran.stderr and "runpy" not in ran.stderr
    assert "FAILED" in ran.stderr
    shown = flow("status")
    assert shown.returncode == 1 and "FAILED" in shown.stdout


def test_detached_task_ssh_follow_and_cancel(flow_home: Path, tmp_path: Path) -> None:
    started = flow("run", "-d", "-N", "2", script(tmp_path, "sleeps.py", SLEEPS))
    assert started.returncode == 0, started.stderr
    task_id = started.stdout.strip()
    task = running(task_id, 2)
    assert flow("status", task_id).returncode == 0  # running: 0

    command = flow("ssh", task_id, "--node", "1", "--command", "echo $FLOW_NODE_RANK; exit 7")
    assert (command.returncode, command.stdout) == (7, "1\n")
    piped = flow("ssh", task_id, "--node", "1", stdin="echo rank=$FLOW_NODE_RANK\npwd\n")
    assert piped.returncode == 0 and "rank=1\n" in piped.stdout
    assert _pty_shell(task_id, node=0) == (9, True)

    follower = subprocess.Popen([FLOW, "logs", task_id, "-f"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    wait_until(lambda: sum("up" in line for line in task.logs()) == 2, 30, "both nodes' 'up'")
    cancelled = flow("cancel", task_id, "--json")
    assert cancelled.returncode == 0
    assert json.loads(cancelled.stdout) == {"task_id": task_id, "status": "CANCELLED",
                                            "cancelled": True}
    out, err = follower.communicate(timeout=15)  # the follow ends with the task
    assert follower.returncode == 0, err
    assert [line.split("] ", 2)[2] for line in out.splitlines()] == ["up", "up"]
    assert flow("status", task_id).returncode == 3
    again = flow("cancel", task_id)
    assert again.returncode == 0 and "already ended" in again.stdout
    assert processes_with_env("FLOW_HOME", str(flow_home)) == []


def _pty_shell(task_id: str, node: int) -> tuple[int, bool]:
    """``flow ssh TASK --node N`` on a terminal: type two commands, return (exit code, whether
    the node's answer came back)."""
    marker = f"marker-{node}-42"
    code, out = run_on_terminal([FLOW, "ssh", task_id, "--node", str(node)], timeout=30,
                                answers=[(b"", b"echo marker-$FLOW_NODE_RANK-$((6*7))\n"),
                                         (marker.encode(), b"exit 9\n")])
    return code, marker in out


def test_ctrl_c_cancels_the_run_and_exits_130(flow_home: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen([FLOW, "run", script(tmp_path, "sleeps.py", SLEEPS)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    first = proc.stdout.readline() if ready else ""
    assert first.startswith("[Node 0] [") and first.endswith(" up\n"), first  # it streams logs
    task = Task.from_id(list_client_records()[0]["task_id"])
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert f"interrupted: task {task.task_id} cancelled" in err
    assert task.status is TaskStatus.CANCELLED
    assert processes_with_env("FLOW_HOME", str(flow_home)) == []


def test_plan_notes_an_option_the_provider_runs_without() -> None:
    """``flow plan`` shows the provider's note for an option it accepts but runs without
    (local: a container image), on stderr and in its JSON."""
    run = flow("plan", "--image", "python:3.11", "--json")
    assert run.returncode == 0, run.stderr
    note = ("local: image= is not used: the nodes run in this machine's Python environment, "
            "not in a container")
    assert json.loads(run.stdout)["notes"] == [note]
    assert f"flow: note: {note}" in run.stderr
    assert json.loads(flow("plan", "--json").stdout)["notes"] == []


def test_plan_says_what_would_launch_without_launching(tmp_path: Path) -> None:
    local = flow("plan", "-N", "2", "--workers-per-node", "2")
    assert local.returncode == 0
    assert local.stdout.startswith("local: 2 processes on this machine")
    # the nodes' image must run this Python (the default image's is 3.12): name it
    same_python = json.dumps({"image_python": f"{sys.version_info[0]}.{sys.version_info[1]}"})
    aws = flow("plan", "--provider", "aws", "--gpu", "h100:8", "-N", "4",
               "--max-run-time-hours", "2", "--json", "--provider-config", same_python)
    assert aws.returncode == 0, aws.stderr
    data = json.loads(aws.stdout)
    assert (data["instance_type"], data["nodes"]) == ("p5.48xlarge", 4)
    assert data["cost_at_cap"] == pytest.approx(data["usd_per_hour"] * 4 * 2)
    table = flow("plan", "--provider", "aws", "--gpu", "h100:8", "--provider-config",
                 same_python)
    assert table.returncode == 0 and "p5.48xlarge" in table.stdout
    # a plan launches nothing: another Python on the nodes is a warning naming both versions
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    other = flow("plan", "--provider", "aws", "--gpu", "h100:8", "--provider-config",
                 '{"image_python": "3.99"}')
    assert other.returncode == 0 and "p5.48xlarge" in other.stdout, other.stderr
    [warning] = other.stderr.splitlines()
    assert warning.startswith("flow: warning: a launch would be refused")
    assert f"image runs Python 3.99, but this program runs Python {mine}" in warning
    as_json = flow("plan", "--provider", "aws", "--gpu", "h100:8", "--json",
                   "--provider-config", '{"image_python": "3.99"}')
    assert "Python 3.99" in json.loads(as_json.stdout)["warnings"][0]
    refused = flow("run", "--provider", "aws", "--gpu", "h100:8", "-y", "--provider-config",
                   '{"image_python": "3.99"}', script(tmp_path, "hello.py", HELLO))
    assert refused.returncode == 2 and "image runs Python 3.99" in refused.stderr
    impossible = flow("plan", "--provider", "aws", "--gpu", "h100:3", "--provider-config",
                      same_python)
    assert impossible.returncode == 2 and "h100:8" in impossible.stderr
    assert flow("plan", "--boot-timeout", "1800").returncode == 0
    too_short = flow("plan", "--boot-timeout", "0")
    assert too_short.returncode == 2 and "--boot-timeout" in too_short.stderr
    assert list_client_records() == []


def test_gc_stops_orphaned_and_ended_tasks_only(flow_home: Path, tmp_path: Path) -> None:
    sleeps = script(tmp_path, "sleeps.py", SLEEPS)
    orphan_id, ended_id, live_id = (flow("run", "-d", sleeps).stdout.strip() for _ in range(3))
    orphan, ended, _ = (running(t, 1) for t in (orphan_id, ended_id, live_id))
    (flow_home / "tasks" / f"{orphan_id}.json").unlink()  # its client is gone
    from flow_sdk import wire
    from flow_sdk.wire import Outcome
    ended.store.put_record_if_absent(wire.outcome_key(ended_id), Outcome(
        "FAILED", "written by the test", time.time()))  # ended, never torn down
    live_pids = ended.provider.node_pids(live_id)  # type: ignore[attr-defined]

    dry = flow("gc", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    [report] = json.loads(dry.stdout)
    assert report["dry_run"] and set(report["reasons"]) == {orphan_id, ended_id}
    assert report["live_tasks"] == [live_id]
    assert orphan.provider.live_pids(orphan_id)  # type: ignore[attr-defined]

    done = flow("gc")
    assert done.returncode == 0, done.stderr
    assert f"task {orphan_id}: no client record" in done.stdout
    assert f"task {ended_id}: task ended FAILED" in done.stdout
    assert orphan.status is TaskStatus.CANCELLED
    assert orphan.provider.node_pids(orphan_id) == []  # type: ignore[attr-defined]
    assert ended.provider.node_pids(ended_id) == []  # type: ignore[attr-defined]
    assert ended.provider.node_pids(live_id) == live_pids  # type: ignore[attr-defined]
    assert "stopped 0 process(es)" in flow("gc").stdout
    assert flow("cancel", live_id).returncode == 0
    assert processes_with_env("FLOW_HOME", str(flow_home)) == []


def test_gc_older_than_removes_finished_tasks_objects_only(flow_home: Path) -> None:
    from flow_sdk import lifecycle, wire
    from flow_sdk.home import tasksecrets
    from flow_sdk.wire import Outcome, signing
    from flow_sdk.providers.local import LocalProvider

    store = LocalProvider().store
    now = time.time()
    sealed = {}
    for task_id in ("done-long-ago", "done-today", "still-running"):
        secret = signing.new_secret()  # launched from this machine: its secret is here
        tasksecrets.save_task_secret(task_id, secret)
        sealed[task_id] = signing.SignedStore(store, bytes.fromhex(secret))
        store.put(wire.task_key(task_id), b"{}")
        store.put(wire.result_key(task_id, 0), b"r")
    lifecycle.record_outcome(sealed["done-long-ago"], "done-long-ago",
                             Outcome("SUCCEEDED", "done", now - 8 * 86400))
    lifecycle.record_outcome(sealed["done-today"], "done-today",
                             Outcome("SUCCEEDED", "done", now - 3600))
    store.put(wire.outcome_key("still-running"), wire.to_json(  # a forgery: no secret
        Outcome("SUCCEEDED", "done", now - 8 * 86400)))

    dry = flow("gc", "--provider", "local", "--older-than", "7d", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    [objects] = [e["objects"] for e in json.loads(dry.stdout) if "objects" in e]
    assert objects["removed_tasks"] == ["done-long-ago"] and objects["dry_run"]
    assert store.get(wire.result_key("done-long-ago", 0)) == b"r"

    done = flow("gc", "--provider", "local", "--older-than", "7d")
    assert done.returncode == 0, done.stderr
    assert "removed 3 object(s) of 1 task(s)" in done.stdout
    assert store.list(wire.task_prefix("done-long-ago")) == []
    for task_id in ("done-today", "still-running"):  # too recent; running
        assert store.get(wire.result_key(task_id, 0)) == b"r"
    hours = flow("gc", "--provider", "local", "--older-than", "0.5h", "--json")
    [objects] = [e["objects"] for e in json.loads(hours.stdout) if "objects" in e]
    assert objects["removed_tasks"] == ["done-today"]
    assert store.get(wire.result_key("still-running", 0)) == b"r"
