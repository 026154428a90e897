"""``app.submit_file`` / ``app.submit_directory``: scripts as tasks (the path ``flow run`` uses)."""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from flow_sdk import FlowApp, TaskStatus, ValidationError
from flow_sdk.errors import ScriptExitError
from flow_sdk.client.scripts import bundle_directory, bundle_file
from flow_sdk.node.scripts import run_bundle


def _project(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "helper.py").write_text("VALUE = 'from-helper'\n")
    (root / "src" / "main.py").write_text(
        "import os, sys\n"
        "from helper import VALUE\n"
        "data = open('data/input.txt').read().strip()\n"
        "print(f'{VALUE} {data} argv={sys.argv[1:]} rank={os.environ.get(\"RANK\", \"-\")}',"
        " flush=True)\n"
        "if '--exit' in sys.argv: sys.exit(int(sys.argv[-1]))\n")
    (root / "data").mkdir()
    (root / "data" / "input.txt").write_text("payload\n")
    for skipped in (".git", "__pycache__", ".venv"):
        (root / skipped).mkdir()
        (root / skipped / "junk.txt").write_text("not shipped\n")
    return root


def test_directory_bundle_ships_code_not_caches_and_runs_like_main(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "tmp"  # outside a task the bundle is unpacked in a temporary folder
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    bundle = bundle_directory(_project(tmp_path / "proj"), "src/main.py", ["--lr", "0.1"])
    names = zipfile.ZipFile(BytesIO(bundle.archive)).namelist()
    assert sorted(names) == ["data/input.txt", "src/helper.py", "src/main.py"]
    assert (bundle.name, bundle.entrypoint) == ("main", "src/main.py")
    cwd, argv = os.getcwd(), sys.argv[:]
    run_bundle(bundle)
    assert capsys.readouterr().out == "from-helper payload argv=['--lr', '0.1'] rank=-\n"
    assert (os.getcwd(), sys.argv) == (cwd, argv)  # restored
    exiting = bundle_directory(tmp_path / "proj", "src/main.py", ["--exit", "0"])
    run_bundle(exiting)  # sys.exit(0) is success: no error
    with pytest.raises(ScriptExitError) as info:
        run_bundle(bundle_directory(tmp_path / "proj", "src/main.py", ["--exit", "3"]))
    assert info.value.code == 3
    assert list(scratch.iterdir()) == []  # each run's folder removed, the failed one's too


@pytest.mark.parametrize(("call", "field"), [
    (lambda root: bundle_directory(root, "../main.py"), "entrypoint"),
    (lambda root: bundle_directory(root, "missing.py"), "entrypoint"),
    (lambda root: bundle_directory(root / "nope", "main.py"), "directory"),
    (lambda root: bundle_file(root / "nope.py"), "path"),
    (lambda root: bundle_file(root / "src" / "main.py", "--lr 0.1"), "args"),
])
def test_bad_script_requests_are_rejected_before_launch(tmp_path: Path, call: object,
                                                        field: str) -> None:
    _project(tmp_path)
    with pytest.raises(ValidationError) as info:
        call(tmp_path)  # type: ignore[operator]
    assert info.value.fields == [field]


@pytest.mark.slow
def test_submit_directory_runs_the_entrypoint_on_every_rank(tmp_path: Path) -> None:
    app = FlowApp("submit-tests")
    task = app.submit_directory(_project(tmp_path / "proj"), entrypoint="src/main.py",
                                args=["--lr", "0.1"], num_instances=2, workers_per_node=2)
    assert task.task_id.startswith("main-")
    assert task.results(timeout=120) == [None] * 4
    assert task.status is TaskStatus.SUCCEEDED
    lines = task.logs()
    for rank in range(4):
        assert any(line.endswith(f"from-helper payload argv=['--lr', '0.1'] rank={rank}")
                   and line.startswith(f"[Node {rank // 2}]") for line in lines), lines


@pytest.mark.slow
def test_submit_file_failure_carries_the_exit_code(tmp_path: Path) -> None:
    path = tmp_path / "exits.py"
    path.write_text("import sys\nprint('bye', flush=True)\nsys.exit(5)\n")
    task = FlowApp("submit-tests").submit_file(path)
    with pytest.raises(ScriptExitError) as info:
        task.result(timeout=120)
    assert info.value.code == 5 and "exits.py exited with code 5" in str(info.value)
    assert any(line.endswith("bye") for line in task.logs())
