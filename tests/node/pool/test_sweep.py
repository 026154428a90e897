"""The pool sweep between two tasks: every process a task left behind is killed before the
next task starts, however it disguised itself, and what the daemon started itself stays.

A task's processes are known by what they cannot change (their place below the daemon, a
subreaper, and the task's cgroup where the node has a writable cgroup v2), never by their
own environment: a leftover that claims to be another node's is killed all the same.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from flow_testing import wait_until

from flow_sdk import FlowApp
from flow_sdk.system import procs
from flow_sdk.client.pools import pool_up
from flow_sdk.node.pool.sweep import CGROUP_PREFIX, own_cgroup_dir

app = FlowApp("sweep")

# A shell that writes its own pid, then becomes `sleep` (same pid). With "trap '' TERM" first,
# the sleep ignores SIGTERM.
_DISGUISE = "{trap}echo $$ > \"$1\"; exec sleep 600"
# The middle of a double fork: a session of its own, the disguised process started, gone.
_MIDDLE = ("import json, os, subprocess, sys; os.setsid(); "
           "subprocess.Popen(sys.argv[1:], env=json.loads(os.environ['DISGUISE_ENV']))")


def _disguised_env() -> dict[str, str]:
    """Another node's environment: another instance id, no other FLOW_* variable of this
    node's, another working directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOW_")}
    env["FLOW_INSTANCE_ID"] = "i-other"
    env["FLOW_NODE_WORKDIR"] = "/nonexistent"
    return env


def _leave_a_disguised_process(pid_file: str, ignore_term: bool = False) -> dict[str, int]:
    """Task A: double-fork a process that execs ``sleep`` claiming to be another node's, and
    return while it runs; its pid (as it wrote it) and start time."""
    script = _DISGUISE.format(trap="trap '' TERM; " if ignore_term else "")
    middle = subprocess.Popen([sys.executable, "-c", _MIDDLE, "sh", "-c", script, "sh",
                               pid_file],
                              env={**os.environ, "DISGUISE_ENV": json.dumps(_disguised_env())})
    middle.wait()
    deadline = time.monotonic() + 10
    while not Path(pid_file).exists() or not Path(pid_file).read_text().endswith("\n"):
        assert time.monotonic() < deadline, "the disguised process never wrote its pid"
        time.sleep(0.01)
    pid = int(Path(pid_file).read_text())
    ticks = procs.start_ticks(pid)
    assert ticks is not None
    assert b"FLOW_INSTANCE_ID=i-other" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return {"pid": pid, "ticks": ticks}


def _is_running(pid: int, ticks: int) -> bool:
    """Task B, at its start: is task A's leftover still there (the same process, not a later
    one that reused its pid)?"""
    return procs.is_alive(pid, ticks)


def _kill_if_alive(process: dict[str, int]) -> None:
    if process and procs.is_alive(process["pid"], process["ticks"]):
        os.kill(process["pid"], signal.SIGKILL)


def _boot_log(flow_home: Path, pool_id: str, instance_id: str) -> str:
    return (flow_home / "local" / "logs" / pool_id / f"boot.{instance_id}.log").read_text()


@pytest.mark.slow
def test_a_leftover_that_claims_another_nodes_identity_is_killed_before_the_next_task(
        flow_home: Path, tmp_path: Path) -> None:
    pool = pool_up("sweep", num_instances=1, idle_stop="10m")
    leftover: dict[str, int] = {}
    try:
        [node] = pool.instances()
        pid_file = tmp_path / "leftover.pid"
        on_pool = app.function(pool="sweep", quiet=True)
        leftover = on_pool(_leave_a_disguised_process).remote(str(pid_file))
        assert int(pid_file.read_text()) == leftover["pid"]
        # task B's worker looks first thing: task A's leftover is gone already
        assert on_pool(_is_running).remote(leftover["pid"], leftover["ticks"]) is False
        assert not procs.is_alive(leftover["pid"], leftover["ticks"])
        log = _boot_log(flow_home, pool.pool_id, node.instance_id)
        killed = [line for line in log.splitlines()
                  if f"killing leftover process {leftover['pid']} " in line]
        assert killed and "(sleep 600)" in killed[0], log
        assert f"node clean: killed 1 leftover process(es) of the task [{leftover['pid']}]" \
            in log, log
    finally:
        _kill_if_alive(leftover)
        pool.down()


# A stand-in for the daemon with no cgroup (the process tree alone): a subreaper that starts
# a helper of its own with a "spare" below it (in a session of its own), then a task that
# leaves two disguised processes (one ignoring SIGTERM), and sweeps.
_DAEMON = r"""
import json, os, subprocess, sys, time
from pathlib import Path

from flow_sdk.system import procs
from flow_sdk.node.pool.sweep import Own, sweep

assert procs.become_subreaper()
leave, folder = json.loads(sys.argv[1]), Path(sys.argv[2])
own = Own()
helper = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen("
                           "['sleep', '600'], start_new_session=True); print(p.pid, flush=True);"
                           " p.wait()"], stdout=subprocess.PIPE, text=True)
own.add(helper.pid)
spare = int(helper.stdout.readline())
left = []
for name, argv in leave.items():
    subprocess.run(argv, env={**os.environ, "DISGUISE_ENV": sys.argv[3]}, check=True)
    pid_file = folder / name
    while not pid_file.exists() or not pid_file.read_text().endswith("\n"):
        time.sleep(0.01)
    left.append([int(pid_file.read_text()), procs.start_ticks(int(pid_file.read_text()))])
workdir = folder / "workdir"
workdir.mkdir()
lines = []
swept = sweep(workdir, own, None, lines.append)
print(json.dumps({"left": left, "log": lines, "describe": swept.describe(),
                  "stopped": swept.stopped, "clean": swept.clean,
                  "workdir": workdir.exists(),
                  "own": [[p, procs.start_ticks(p)] for p in (helper.pid, spare)]}), flush=True)
sys.stdin.read()  # until the test has looked
os.kill(spare, 9)
helper.wait()
"""


def test_without_a_cgroup_the_process_tree_tells_a_tasks_leftovers_from_the_daemons_own(
        tmp_path: Path) -> None:
    leave = {name: [sys.executable, "-c", _MIDDLE, "sh", "-c",
                    _DISGUISE.format(trap=trap), "sh", str(tmp_path / name)]
             for name, trap in (("plain", ""), ("deaf", "trap '' TERM; "))}
    daemon = subprocess.Popen([sys.executable, "-c", _DAEMON, json.dumps(leave), str(tmp_path),
                               json.dumps(_disguised_env())],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    report: dict[str, Any] = {}
    try:
        assert daemon.stdout is not None and daemon.stdin is not None
        report = json.loads(daemon.stdout.readline())
        (plain, plain_ticks), (deaf, deaf_ticks) = report["left"]
        assert not procs.is_alive(plain, plain_ticks)
        assert not procs.is_alive(deaf, deaf_ticks)
        assert sorted(report["stopped"]) == sorted([plain, deaf])
        assert report["clean"] and not report["workdir"], report
        log = report["log"]
        assert f"killing leftover process {plain} (sleep 600): SIGTERM" in log
        assert f"killing leftover process {deaf} (sleep 600): SIGTERM" in log
        assert f"killing leftover process {deaf} (sleep 600): SIGKILL" in log  # it ignored TERM
        assert f"killing leftover process {plain} (sleep 600): SIGKILL" not in log
        # the daemon's own helper and the spare below it were left alone
        assert all(procs.is_alive(pid, ticks) for pid, ticks in report["own"]), report
        assert not any(f"process {pid} " in line for pid, _ in report["own"] for line in log)
        daemon.stdin.close()
        assert daemon.wait(timeout=30) == 0
    finally:
        for pid, ticks in report.get("left", []) + report.get("own", []):
            _kill_if_alive({"pid": pid, "ticks": ticks})
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def _wait_for(go_file: str) -> str:
    """Every node, every generation: run until ``go_file`` exists."""
    print("waiting for the go", flush=True)
    while not Path(go_file).exists():
        time.sleep(0.05)
    return "done"


@pytest.mark.slow
def test_the_spare_a_daemon_starts_survives_its_sweep(flow_home: Path, tmp_path: Path) -> None:
    pool = pool_up("respawn", num_instances=2, spares=1, idle_stop="10m")
    go_file = tmp_path / "go"
    try:
        task = app.function(num_instances=2, max_restarts=1, pool="respawn",
                            quiet=True)(_wait_for).spawn(str(go_file))
        wait_until(lambda: sum("waiting for the go" in line for line in task.logs()) == 2,
                   120, "both workers running")
        gang = {n.node: n.instance_id for n in task.nodes()}
        records = {rec["instance_id"]: rec for rec in _instance_records(flow_home, pool.pool_id)}
        os.kill(records[gang[1]]["pid"], signal.SIGKILL)  # node 1 is lost, daemon and all
        [spare] = set(records) - set(gang.values())
        wait_until(lambda: "new spare node(s)" in _boot_log(flow_home, pool.pool_id, spare),
                   120, "the spare's daemon starting a new spare")
        go_file.write_text("go")
        assert task.result(timeout=120) == "done"
        wait_until(lambda: "node clean" in _boot_log(flow_home, pool.pool_id, spare), 60,
                   "the spare's sweep after the task")
        [new] = set(r["instance_id"] for r in _instance_records(flow_home, pool.pool_id)) - \
            set(records)
        new_record = {r["instance_id"]: r for r in
                      _instance_records(flow_home, pool.pool_id)}[new]
        # the new node's daemon runs below the daemon that swept, and outlived its sweep
        assert new_record["pid"] in procs.descendants(records[spare]["pid"])
        assert procs.is_alive(new_record["pid"], new_record["ticks"])
        wait_until(lambda: new in pool.members() and pool.members()[new].state == "idle", 60,
                   "the new spare idle")
        assert f"killing leftover process {new_record['pid']}" not in \
            _boot_log(flow_home, pool.pool_id, spare)
        # the next task's cgroup (where the machine has cgroup v2) takes the place of the one
        # the killed daemon never swept
        go_file.unlink()
        again = app.function(num_instances=2, pool="respawn", quiet=True)(_wait_for)
        assert again.remote(str(tmp_path)) == "done"
        parent = own_cgroup_dir()
        dead = f"{CGROUP_PREFIX}{records[gang[1]]['pid']}-{records[gang[1]]['ticks']}-"
        assert parent is None or not any(p.name.startswith(dead) for p in parent.iterdir())
    finally:
        pool.down()


def _instance_records(flow_home: Path, pool_id: str) -> list[dict[str, Any]]:
    folder = flow_home / "local" / "instances" / pool_id
    return [json.loads(p.read_text()) for p in sorted(folder.glob("i-*.json"))]
