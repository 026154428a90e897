"""What `flow run` shows: the phases on a terminal (a real pty), plain time-stamped lines when
piped, nothing with --quiet; the rendezvous reaches n/n nodes; what the workers do before
the first line (`.remote()` too); a script's own modules travel with it; one exit code, the
script's; SIGTERM and SIGHUP cancel the task like Ctrl-C, and cancelled nodes say so."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
from flow_testing import processes_with_env, run_on_terminal, wait_until

from flow_sdk import FlowApp, Task, TaskStatus
from flow_sdk.client.records import list_client_records
from flow_sdk.wire import NodePhase
from flow_sdk.wire.records import WORKER_ACTIVITIES

pytestmark = pytest.mark.slow

HELLO = """
import os
print(f"hello from rank {os.environ['RANK']}", flush=True)
"""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
app = FlowApp("progress")
UNPICKLE_S = 3.0


def _slow_to_unpickle() -> None:
    import os
    import time

    if "RANK" in os.environ:  # on a worker, not while the caller pickles it
        time.sleep(UNPICKLE_S)


class SlowToUnpickle:
    """Takes UNPICKLE_S to unpickle on a worker: the worker is "importing your code"."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return _slow_to_unpickle, ()


SLOW = SlowToUnpickle()


@app.function(num_instances=2)
def says_hello() -> str:
    import time

    time.sleep(1.5)  # long enough for the agents' and the caller's polls to see it run
    print(f"hello after {SLOW!r}", flush=True)
    return "done"


@app.function(num_instances=2)
def sleeps() -> None:
    import time

    print("up", flush=True)
    time.sleep(300)


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
    # the rendezvous line reaches 2/2 before the task runs
    said = [ln.split(" flow: ", 1)[1].rsplit(" [", 1)[0] for ln in phase_lines]
    assert said.index("rendezvous: 2/2 nodes joined") < said.index("running on 2 node(s)")
    assert "hello from rank 0" in ran.stdout and "hello from rank 1" in ran.stdout
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


def test_remote_says_what_the_workers_do_before_their_first_line(
        flow_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert says_hello.remote() == "done"
    err = capsys.readouterr().err
    said = [ln.split(" flow: ", 1)[1].rsplit(" [", 1)[0] for ln in err.splitlines()
            if " flow: " in ln]
    prefix = "running on 2 node(s): workers "
    workers = [s.removeprefix(prefix) for s in said if s.startswith(prefix)]
    stages = [w.split(" (", 1)[0] for w in workers]
    # in order, ending once both nodes run the code; unpickling the call takes UNPICKLE_S,
    # so "importing your code" is always seen
    assert stages == sorted(stages, key=WORKER_ACTIVITIES.index), said
    assert "importing your code" in stages and workers[-1] == "running your code", said
    assert all(re.fullmatch(r"[a-z ]+ \([12]/2 node\(s\)\)", w) for w in workers[:-1]), said
    assert said.index("rendezvous: 2/2 nodes joined") < said.index(prefix + workers[0])


def test_cancelled_nodes_show_phase_cancelled(flow_home: Path) -> None:
    task = sleeps.spawn()
    wait_until(lambda: [(n.phase, n.activity) for n in task.nodes()] == [
        (NodePhase.RUNNING, "running your code")] * 2, 60, "both nodes to run the function")
    task.cancel()
    assert task.status is TaskStatus.CANCELLED
    wait_until(lambda: [n.phase for n in task.nodes()] == [NodePhase.CANCELLED] * 2, 30,
               "both nodes to record that they were cancelled")
    shown = subprocess.run(["flow", "status", "--json", task.task_id], capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    phases = [n["phase"] for n in json.loads(shown.stdout)["nodes"]]
    assert phases == ["cancelled", "cancelled"], shown.stdout
