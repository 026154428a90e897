"""``flow_sdk.providers.host``: the file and command operations a file store needs, done here
(``LocalHost``) and answered one JSON line per request by ``serve`` (what an ``SshHost``
talks to on a login node; the Slurm login tests run it over a real SSH connection)."""

from __future__ import annotations

import errno
import io
import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from flow_sdk.providers import host, sshhost


def _served(*requests: tuple[str, list[object]]) -> list[dict[str, object]]:
    answers = io.BytesIO()
    lines = b"".join(host.request_line(op, list(args), number)
                     for number, (op, args) in enumerate(requests, 1))
    host.serve(host.LocalHost(), io.BytesIO(lines), answers)
    return [json.loads(line) for line in answers.getvalue().splitlines()]


def test_writes_are_private_and_whole_and_each_mode_keeps_its_promise(tmp_path: Path) -> None:
    local = host.LocalHost()
    target = str(tmp_path / "a" / "b" / "file")
    assert local.write(target, b"zero") and local.write(target, b"one")  # replaced whole
    assert local.read(target) == b"one"
    assert stat.S_IMODE(Path(target).stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert not local.write(target, b"two", "if_absent") and local.read(target) == b"one"
    assert local.write(target, b"+", "append") and local.read(target, 2) == b"e+"
    with pytest.raises(FileExistsError):
        local.write(target, b"two", "new")
    with pytest.raises(ValueError, match="write mode 'sideways'"):
        local.write(str(tmp_path / "c" / "d"), b"", "sideways")
    assert local.kind(str(tmp_path / "c")) is None  # refused before anything was made
    assert local.files_under(str(tmp_path)) == ["a/b/file"]  # no temporary file left
    assert local.read(str(tmp_path / "missing")) is None
    assert local.read(target + "/under-a-file") is None
    assert local.names(str(tmp_path / "a")) == ["b"] and local.names(target) is None
    assert (local.kind(str(tmp_path / "a")), local.kind(target)) == ("dir", "file")
    local.remove(str(tmp_path / "a"))
    assert local.kind(str(tmp_path / "a")) is None
    assert local.run(["no-such-command-here"], 5)[0] == 127


def test_serve_answers_each_request_and_a_failure_travels_with_its_errno(
        tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    answers = _served(("write", [path, {"b64": "aGk="}, "new"]),
                      ("write", [path, {"b64": "aGk="}, "new"]),
                      ("read", [path, 0]), ("no-such-op", []), ("home", []))
    assert [a["id"] for a in answers] == [1, 2, 3, 4, 5]
    assert answers[0]["ok"] is True
    assert answers[1]["error"] == "FileExistsError" and answers[1]["errno"] == errno.EEXIST
    assert host.decode(answers[2]["ok"]) == b"hi"
    assert answers[3]["error"] == "KeyError"  # refused; the next request is still answered
    assert answers[4]["ok"] == str(Path.home())
    assert host.answer_to(json.dumps(answers[4]).encode(), 5) == answers[4]
    assert host.answer_to(json.dumps(answers[4]).encode(), 4) is None  # another's
    assert host.answer_to(b"Welcome to the login node\n", 5) is None


def test_the_modules_source_serves_from_the_one_line_the_far_side_runs(
        tmp_path: Path) -> None:
    assert "\n" not in sshhost.BOOTSTRAP
    done = subprocess.run([sys.executable, "-I", "-c", sshhost.BOOTSTRAP],
                          input=host.request_line("kind", [str(tmp_path)], 7),
                          capture_output=True, timeout=60, check=True)
    assert json.loads(done.stdout) == {"id": 7, "ok": "dir"}
