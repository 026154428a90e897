"""Usage errors are one line on stderr naming the flag and the fix (exit 2, nothing
launched); `flow logs --rank`; `--node` and `--rank` outside the task are refused on ended
tasks too; environment variables reach the workers, except the gang's own in auto mode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flow_sdk.client.records import list_client_records
from flow_sdk.client.task import Task

_BESIDE = Path(sys.executable).with_name("flow")
FLOW = str(_BESIDE) if _BESIDE.exists() else (shutil.which("flow") or "flow")

SHOWS_ENV = """
import os
print("seen", os.environ["RANK"], os.environ.get("CUDA_VISIBLE_DEVICES"),
      os.environ.get("NCCL_DEBUG"), os.environ.get("OMP_NUM_THREADS"), flush=True)
"""


def flow(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLOW, *args], capture_output=True, text=True, timeout=timeout,
                          check=False, stdin=subprocess.DEVNULL)


def one_line(ran: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a usage error (exit 2, nothing on stdout)."""
    assert ran.returncode == 2, (ran.returncode, ran.stderr)
    lines = ran.stderr.splitlines()
    assert len(lines) == 1, ran.stderr
    assert lines[0].startswith("flow: ") and "Traceback" not in ran.stderr
    return lines[0]


@pytest.fixture(scope="module")
def hello(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("scripts") / "hello.py"
    path.write_text("print('hi', flush=True)\n")
    return str(path)


USAGE = [  # (arguments, what the line names, the fix it gives)
    (["run", "--bogus-flag", "{hello}"], "--bogus-flag: no such option", "`flow run --help`"),
    (["run", "--wrkers-per-node=2", "{hello}"], "--wrkers-per-node: no such option",
     "did you mean --workers-per-node?"),
    (["run", "/no/such/script.py"], "PATH: '/no/such/script.py' does not exist",
     "give a script or a directory"),
    (["plan", "--wrkers-per-node", "2"], "--wrkers-per-node", "did you mean --workers-per-node?"),
    (["--bogus"], "--bogus", "`flow --help`"),
    (["run"], "PATH", "write `flow run [OPTIONS] PATH [ARGS]...`"),
    (["logs"], "TASK", "write `flow logs [OPTIONS] TASK`"),
    (["run", "-N", "two", "{hello}"], "--num-instances: 'two' is not a valid integer",
     "`flow run --help`"),
    (["logs", "x", "--rank", "first"], "--rank: 'first' is not a valid integer",
     "`flow logs --help`"),
    (["run", "--distributed-mode", "magic", "{hello}"], "--distributed-mode",
     "'auto', 'manual'"),
    (["run", "--workers-per-node", "0", "{hello}"], "--workers-per-node: ",
     "between 1 and 256, got 0"),
    (["plan", "--workers-per-node", "0"], "--workers-per-node: ", "between 1 and 256"),
    (["run", "--volume", "/p=name:10:block", "-N", "2", "{hello}"], "--volume: ",
     "use interface='file'"),
    (["run", "--min-instances", "3", "-N", "2", "{hello}"], "--min-instances: ", "between 1"),
    (["run", "--env", "RANK=99", "{hello}"], "--env: sets RANK:",
     "drop them from environment, or use distributed_mode='manual'"),
    (["plan", "--env", "MASTER_ADDR=1.2.3.4", "--env", "FLOW_TASK_ID=x"],
     "--env: sets FLOW_TASK_ID, MASTER_ADDR:", "distributed_mode='manual'"),
    (["status", "a", "b"], "unexpected extra argument (b)", "write `flow status [OPTIONS] [TASK]`"),
    (["nosuch"], "No such command 'nosuch'", "`flow --help`"),
]


@pytest.mark.parametrize(("args", "names", "fix"), USAGE, ids=[" ".join(a) for a, _, _ in USAGE])
def test_usage_errors_are_one_line_naming_the_flag_and_the_fix(
        flow_home: Path, hello: str, args: list[str], names: str, fix: str) -> None:
    line = one_line(flow(*[a.format(hello=hello) for a in args]))
    assert names in line and fix in line, line
    assert list_client_records() == []  # nothing was launched


def test_a_bare_flow_still_prints_the_help() -> None:
    ran = flow()
    assert "Usage: flow [OPTIONS] COMMAND" in ran.stdout + ran.stderr
    assert "Exit codes" in ran.stdout + ran.stderr


@pytest.fixture(scope="module")
def ended(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, Path]:
    """A 2-node x 2-worker task that ended, run with --env values of the user's own:
    (task id, its output, its FLOW_HOME)."""
    home = tmp_path_factory.mktemp("home")
    script = home / "shows_env.py"
    script.write_text(textwrap.dedent(SHOWS_ENV))
    ran = subprocess.run([FLOW, "run", "-N", "2", "--workers-per-node", "2", "--json",
                          "--env", "CUDA_VISIBLE_DEVICES=7", "--env", "NCCL_DEBUG=WARN",
                          "--env", "OMP_NUM_THREADS=3", str(script)],
                         capture_output=True, text=True, timeout=180, check=False,
                         stdin=subprocess.DEVNULL, env={**os.environ, "FLOW_HOME": str(home)})
    assert ran.returncode == 0, ran.stderr
    outcome = json.loads(ran.stdout)
    assert outcome["status"] == "SUCCEEDED"
    return outcome["task_id"], ran.stderr, home


@pytest.fixture
def at_home(ended: tuple[str, str, Path], monkeypatch: pytest.MonkeyPatch) -> str:
    """The ended task's id, with FLOW_HOME set to its home."""
    task_id, _, home = ended
    monkeypatch.setenv("FLOW_HOME", str(home))
    return task_id


def test_values_passed_in_env_win_on_every_worker(ended: tuple[str, str, Path]) -> None:
    _, output, _ = ended
    seen = sorted(line.split("seen ", 1)[1] for line in output.splitlines() if "seen " in line)
    assert seen == [f"{rank} 7 WARN 3" for rank in range(4)]


def test_logs_rank_keeps_one_workers_lines(at_home: str) -> None:
    only = flow("logs", at_home, "--rank", "3")
    assert only.returncode == 0, only.stderr
    lines = [ln for ln in only.stdout.splitlines() if "seen" in ln]
    assert len(lines) == 1 and "[rank 3] seen 3 7 WARN 3" in lines[0], only.stdout
    entries = [json.loads(ln) for ln in flow("logs", at_home, "--rank", "2", "--json"
                                             ).stdout.splitlines()]
    assert {(e["node"], e["rank"], e["text"]) for e in entries if e["kind"] == "worker"} == {
        (1, 2, "seen 2 7 WARN 3")}
    line = one_line(flow("logs", at_home, "--rank", "4"))
    assert "--rank: " in line and "ranks 0..3; there is no rank 4" in line


@pytest.mark.parametrize("command", [["logs"], ["ssh", "-c", "true"], ["ssh"]])
def test_a_node_outside_an_ended_task_is_a_usage_error(at_home: str,
                                                       command: list[str]) -> None:
    line = one_line(flow(command[0], at_home, "--node", "7", *command[1:]))
    assert "--node: " in line and "2 node(s), 0..1; there is no node 7" in line, line
    assert "flow logs" not in line  # no hint to read the logs of a node that never was


def test_manual_mode_leaves_rank_to_the_user_and_keeps_every_result(
        flow_home: Path, tmp_path: Path) -> None:
    script = tmp_path / "manual.py"
    script.write_text("import os\nprint('rank is', os.environ['RANK'], flush=True)\n")
    ran = flow("run", "-N", "2", "--distributed-mode", "manual", "--env", "RANK=5", "--json",
               str(script), timeout=180)
    assert ran.returncode == 0, ran.stderr
    outcome = json.loads(ran.stdout)
    assert outcome["status"] == "SUCCEEDED"
    assert sorted(ln.split("] ")[-1] for ln in ran.stderr.splitlines()
                  if "rank is" in ln) == ["rank is 5", "rank is 5"]
    # the user's RANK is theirs: flow still counts one worker per node, ranks 0 and 1
    assert len(Task.from_id(outcome["task_id"]).results(timeout=30)) == 2
    entries = [json.loads(ln) for ln in flow("logs", outcome["task_id"], "--json"
                                             ).stdout.splitlines()]
    assert sorted(e["rank"] for e in entries if e["kind"] == "worker") == [0, 1]
