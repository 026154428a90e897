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

from flow_sdk.providers import host


def _served(*requests: tuple[str, list[object]]) -> list[dict[str, object]]:
    answers = io.BytesIO()
    lines = b"".join(host.request_line(op, list(args)) for op, args in requests)
    host.serve(host.LocalHost(), io.BytesIO(lines), answers)
    return [json.loads(line) for line in answers.getvalue().splitlines()]


def test_writes_are_private_and_whole_and_each_mode_keeps_its_promise(tmp_path: Path) -> None:
    local = host.LocalHost()
    target = str(tmp_path / "a" / "b" / "file")
    assert local.write(target, b"one") and local.read(target) == b"one"
    assert stat.S_IMODE(Path(target).stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert not local.write(target, b"two", "if_absent") and local.read(target) == b"one"
    assert local.write(target, b"+", "append") and local.read(target, 2) == b"e+"
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
    assert answers[0] == {"ok": True}
    assert answers[1]["error"] == "FileExistsError" and answers[1]["errno"] == errno.EEXIST
    assert host.decode(answers[2]["ok"]) == b"hi"
    assert answers[3]["error"] == "KeyError"  # refused; the next request is still answered
    assert answers[4] == {"ok": str(Path.home())}


def test_the_modules_source_serves_under_python_c_as_the_far_side_runs_it(
        tmp_path: Path) -> None:
    source = Path(host.__file__).read_text()
    done = subprocess.run([sys.executable, "-I", "-c", source],
                          input=host.request_line("kind", [str(tmp_path)]), capture_output=True,
                          timeout=60, check=True)
    assert json.loads(done.stdout) == {"ok": "dir"}
