"""What `flow run` shows: the phases on a terminal (a real pty), plain time-stamped lines when
piped, nothing with --quiet; a script's own modules travel with it; one exit code, the
script's; SIGTERM and SIGHUP cancel the task like Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
from flow_testing import processes_with_env, run_on_terminal, wait_until

from flow_sdk import Task, TaskStatus
from flow_sdk.client.records import list_client_records

pytestmark = pytest.mark.slow

HELLO = """
import os
print(f"hello from rank {os.environ['RANK']}", flush=True)
"""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def test_phases_of_a_two_node_run_on_a_terminal(tmp_path: Path) -> None:
    code, out = run_on_terminal(["flow", "run", "-N", "2", str(_script(tmp_path, "h.py", HELLO))])
    text = _ANSI.sub("", out)
    assert code == 0, text
    phases = [m for m in ("plan: 2 node(s)", "provisioning: ", "running on 2 node(s)",
                          "SUCCEEDED") if m in text]
    assert phases == ["plan: 2 node(s)", "provisioning: ", "running on 2 node(s)", "SUCCEEDED"]
    assert text.index("plan: ") < text.index("provisioning: ") < text.index("running on")
    assert re.search(r"running on 2 node\(s\) \[\d+\.\ds\]", text)  # elapsed time
    assert "\x1b[" in out  # drawn as a terminal status line, not plain lines
    assert "hello from rank 0" in text and "hello from rank 1" in text


def test_piped_output_is_plain_time_stamped_lines_and_quiet_shows_none(tmp_path: Path) -> None:
    path = str(_script(tmp_path, "h.py", HELLO))
    ran = subprocess.run(["flow", "run", "-N", "2", path], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert ran.returncode == 0, ran.stderr
    assert "\x1b" not in ran.stderr + ran.stdout
    phase_lines = [ln for ln in ran.stderr.splitlines() if " flow: " in ln]
    assert all(re.match(r"^\d\d:\d\d:\d\d flow: ", ln) for ln in phase_lines), phase_lines
    assert any(re.match(r"^\d\d:\d\d:\d\d flow: provisioning: \d/2 nodes up \[\d+\.\ds\]$", ln)
               for ln in phase_lines), phase_lines
    quiet = subprocess.run(["flow", "run", "--quiet", path], capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr.splitlines() == [quiet.stderr.strip()]  # the outcome line only
    assert "SUCCEEDED" in quiet.stderr and "provisioning" not in quiet.stderr


def test_a_script_ships_the_modules_beside_it_and_exits_with_its_own_code(
        tmp_path: Path) -> None:
    _script(tmp_path, "datautils.py", "def double(x):\n    return 2 * x\n")
    (tmp_path / "helpers").mkdir()
    _script(tmp_path / "helpers", "__init__.py", "from .calc import triple\n")
    _script(tmp_path / "helpers", "calc.py", "def triple(x):\n    return 3 * x\n")
    train = _script(tmp_path, "train.py", """
        import os, sys
        import datautils
        from helpers import triple
        print("rank", os.environ["RANK"], datautils.double(2), triple(2), flush=True)
        sys.exit(int(sys.argv[1]))
    """)
    ran = subprocess.run(["flow", "run", "-N", "2", str(train), "0"], capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert ran.returncode == 0, ran.stderr
    assert "rank 0 4 6" in ran.stdout and "rank 1 4 6" in ran.stdout, ran.stderr
    ran = subprocess.run(["flow", "run", str(train), "3"], capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert ran.returncode == 3, ran.stderr  # the script's code, once
    assert ran.stderr.count("exited with code 3") == 1, ran.stderr


def test_an_import_by_computed_name_fails_before_launch_naming_the_directory_form(
        tmp_path: Path) -> None:
    path = _script(tmp_path, "dyn.py", "import importlib\nimportlib.import_module('x' + 'y')\n")
    ran = subprocess.run(["flow", "run", str(path)], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert ran.returncode == 2
    assert f"flow run --entrypoint dyn.py {tmp_path}" in ran.stderr
    assert list_client_records() == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_cancel_the_task(flow_home: Path, tmp_path: Path,
                                            sig: signal.Signals) -> None:
    path = _script(tmp_path, "sleeps.py", "import time\nprint('up', flush=True)\n"
                                          "time.sleep(300)\n")
    proc = subprocess.Popen(["flow", "run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    assert proc.stdout.readline().endswith(" up\n")  # the script runs
    task = Task.from_id(list_client_records()[0]["task_id"])
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert f"{sig.name}: task {task.task_id} cancelled" in err and "Traceback" not in err
    assert task.status is TaskStatus.CANCELLED
    wait_until(lambda: not processes_with_env("FLOW_HOME", str(flow_home)), 10, "no processes")
