"""The exit-code table, command by command: bad input gives ONE line on stderr, the
documented code and no traceback; `--json` parses for every command that has it."""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from flow_testing import wait_until

from flow_sdk import Task
from flow_sdk.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ended(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A finished 2-node task, in a FLOW_HOME of its own: (task id, FLOW_HOME)."""
    home = tmp_path_factory.mktemp("home")
    script = home / "hello.py"
    script.write_text("print('hi', flush=True)\n")
    ran = subprocess.run(["flow", "run", "-d", "-N", "2", str(script)], capture_output=True,
                         text=True, timeout=120, env=_env(home), stdin=subprocess.DEVNULL,
                         check=True)
    task_id = ran.stdout.strip()
    yield task_id, home


def _env(home: Path) -> dict[str, str]:
    import os

    return {**os.environ, "FLOW_HOME": str(home)}


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


BAD = [  # (arguments, exit code, what the one line names)
    (["run", "--provider", "nope", "{hello}"], 2, "--provider"),
    (["run", "-N", "0", "{hello}"], 2, "--num-instances"),
    (["run", "--provider-config", '{{"nope": 1}}', "{hello}"], 2, "--provider-config"),
    (["run", "--provider-config", "[1]", "{hello}"], 2, "--provider-config"),
    (["run", "--env", "NOEQUALS", "{hello}"], 2, "--env"),
    (["run", "--entrypoint", "a.py", "{hello}"], 2, "--entrypoint"),
    (["run", "{dyn}"], 2, "--entrypoint"),
    (["run", "{broken}"], 2, "line 1"),
    (["run", "--gpu", "h100:8", "--provider", "aws", "--region", "mars-1", "{hello}"], 2,
     "--region"),
    (["status", "no-such-task"], 2, "no task"),
    (["logs", "no-such-task"], 2, "no task"),
    (["logs", "{task}", "--node", "7"], 2, "--node: "),
    (["logs", "{task}", "--rank", "2"], 2, "--rank: "),
    (["logs", "{task}", "--since", "yesterday"], 2, "--since"),
    (["ssh", "{task}", "--node", "7", "-c", "true"], 2, "--node: "),
    (["ssh", "{task}", "--json"], 2, "--json needs --command"),
    (["cancel", "no-such-task"], 2, "no task"),
    (["doctor", "no-such-task"], 2, "no task"),
    (["plan", "--provider", "nope"], 2, "--provider"),
    (["plan", "--gpu", "h100:99"], 2, "--gpu"),
    (["plan", "--provider", "local", "--provider-config", '{{"nope": 1}}'], 2,
     "known keys: root, ssh, sshd"),
    (["gc", "--provider", "nope"], 2, "--provider"),
    (["gc", "--older-than", "a while"], 2, "--older-than"),
    (["volumes", "list", "--provider", "aws"], 1, "no AWS credentials"),
    (["volumes", "list", "--provider", "aws", "--region", "Nowhere"], 2,
     "'Nowhere' is not an AWS region"),
    (["volumes", "create", "../escape"], 2, "name"),
    (["volumes", "delete", "no-such-volume", "--yes"], 1, "no volume named"),
    (["catalog", "refresh", "--region", "us-east-1"], 1, "no AWS credentials"),
]


@pytest.mark.parametrize(("args", "code", "names"), BAD,
                         ids=[" ".join(a[:3]) for a, _, _ in BAD])
def test_bad_input_is_one_line_with_the_documented_code(
        ended: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        args: list[str], code: int, names: str) -> None:
    task_id, home = ended
    monkeypatch.setenv("FLOW_HOME", str(home))
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                "AWS_PROFILE", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    paths = {"hello": _script(tmp_path, "hello.py", "print('hi')\n"),
             "dyn": _script(tmp_path, "dyn.py", "import importlib\n"
                                                "importlib.import_module('x' + 'y')\n"),
             "broken": _script(tmp_path, "broken.py", "def (:\n"), "task": task_id}
    argv = [a.format(**paths) for a in args]
    result = CliRunner().invoke(main, argv)
    err = result.stderr
    assert result.exit_code == code, (result.exit_code, err, result.exception)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert names in lines[0], err
    assert "Traceback" not in result.output + err


def test_debug_shows_the_traceback(ended: tuple[str, Path],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    task_id, home = ended
    monkeypatch.setenv("FLOW_HOME", str(home))
    result = CliRunner().invoke(main, ["--debug", "logs", task_id, "--node", "7"])
    assert result.exit_code != 0 and result.exception is not None  # raised, not one line


def test_json_parses_for_every_command_that_has_it(
        flow_home: Path, tmp_path: Path) -> None:
    sleeps = _script(tmp_path, "sleeps.py", "import time\nprint('up', flush=True)\n"
                                            "time.sleep(300)\n")

    def flow(*args: str) -> object:
        ran = subprocess.run(["flow", *args], capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL, check=False)
        assert ran.returncode in (0, 3), (args, ran.stderr)
        return json.loads(ran.stdout)

    started = flow("run", "-d", "--json", "-N", "2", sleeps)
    assert isinstance(started, dict)
    task = Task.from_id(started["task_id"])
    wait_until(lambda: sum("up" in ln for ln in task.logs()) == 2, 90, "both nodes up")
    assert flow("status", "--json")["task_id"] == task.task_id  # type: ignore[index]
    assert [t["task_id"] for t in flow("list", "--json")] == [task.task_id]  # type: ignore[union-attr]
    logs = subprocess.run(["flow", "logs", task.task_id, "--json"], capture_output=True,
                          text=True, timeout=60, check=True).stdout.splitlines()
    entries = [json.loads(line) for line in logs]
    assert {(e["node"], e["rank"], e["kind"], e["text"]) for e in entries} == {
        (0, 0, "worker", "up"), (1, 1, "worker", "up")}
    ssh = flow("ssh", task.task_id, "--node", "1", "-c", "echo $FLOW_NODE_RANK", "--json")
    assert ssh == {"task_id": task.task_id, "node": 1, "exit_code": 0, "stdout": "1\n",  # type: ignore[comparison-overlap]
                   "stderr": ""}
    assert all(c["ok"] for c in flow("doctor", task.task_id, "--json"))  # type: ignore[union-attr]
    assert flow("cancel", task.task_id, "--json")["cancelled"] is True  # type: ignore[index]
    assert flow("plan", "-N", "2", "--json")["nodes"] == 2  # type: ignore[index]
    assert isinstance(flow("gc", "--dry-run", "--json"), list)
    assert flow("volumes", "list", "--json") == []
    assert flow("volumes", "create", "ckpt", "--size-gb", "1", "--json")["name"] == "ckpt"  # type: ignore[index]
    assert [v["name"] for v in flow("volumes", "list", "--json")] == ["ckpt"]  # type: ignore[union-attr]
    ran = flow("run", "--json", _script(tmp_path, "ok.py", "print('fine')\n"))
    assert ran["status"] == "SUCCEEDED" and ran["exit_code"] == 0  # type: ignore[index]


def test_a_reader_that_goes_away_ends_the_command_silently(ended: tuple[str, Path]) -> None:
    """`flow logs TASK | head -1`: once the reader is gone, flow stops with 141 (SIGPIPE in
    the exit-code table) and says nothing, instead of a "network: Broken pipe" error."""
    task_id, home = ended
    wait_until(lambda: "hi" in subprocess.run(["flow", "logs", task_id], capture_output=True,
                                              text=True, env=_env(home)).stdout, 60, "its line")
    proc = subprocess.Popen(["flow", "logs", task_id], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env(home), stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before flow writes its first line
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (141, b"")
