"""The one-step rehearsal, as the README writes it: its Python block (a 2-node task on
``provider="aws-sim"``) and its command-line block (``flow run``, ``flow list``, ``flow gc
--dry-run``, ``flow volumes list``, ``python -m flow_sdk.sim stop``) run from a clean
environment (no AWS settings, no credentials, HOME and FLOW_HOME in a temporary directory).
Every command exits 0, they print what the README says, and nothing of the simulated account
is left: no server, no instance process, no mount. The README-blocks test leaves these two
blocks to this test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flow_testing import wait_until
from test_readme_blocks import REHEARSAL, readme_blocks

from flow_sdk.system.procs import is_alive
from flow_sdk.sim._server import read_state

pytestmark = pytest.mark.slow


def _clean_env(tmp: Path) -> dict[str, str]:
    """No AWS_* variable, no credentials file reachable, HOME and FLOW_HOME under ``tmp``."""
    bin_dir = str(Path(sys.executable).parent)
    return {"PATH": os.pathsep.join([bin_dir, "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": str(tmp), "FLOW_HOME": str(tmp / "flow"), "LANG": "C.UTF-8"}


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _mounts_under(root: Path) -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4] for line in lines if line.split()[4].startswith(str(root))]


def _block(first_line: str) -> str:
    return next(b.text for b in readme_blocks() if b.first_line == first_line)


def test_rehearse_two_nodes_then_gc_volumes_and_list_with_no_credentials(tmp_path: Path) -> None:
    env = _clean_env(tmp_path)
    home = tmp_path / "flow" / "aws-sim"
    python_block, shell_block = (_block(line) for line in REHEARSAL)
    (tmp_path / "rehearse.py").write_text(python_block)
    (tmp_path / "rehearse.sh").write_text(shell_block)
    states = []
    try:
        out = _run([sys.executable, "rehearse.py"], env, tmp_path)
        assert "['rank 0 of 2', 'rank 1 of 2']" in out
        assert read_state(home) is None  # stop_account() stopped it
        shell = subprocess.Popen(["bash", "-euo", "pipefail", "rehearse.sh"], env=env,
                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        wait_until(lambda: read_state(home) is not None or shell.poll() is not None, 120,
                   "the command-line block's account")
        states.append(read_state(home))
        out, err = shell.communicate(timeout=400)
        assert shell.returncode == 0, f"the shell block exited {shell.returncode}:\n{out}\n{err}"
        assert "] rank 0\n" in out and "] rank 1\n" in out  # both nodes' output, labelled
        assert "aws-sim: would reclaim: 0 instance(s), 0 other resource(s)" in out
        assert "aws-sim: the simulated account holds nothing" in out
        assert ["NAME", "INTERFACE", "SIZE_GB", "IN", "USE", "BY", "LOCATION"] in [
            line.split() for line in out.splitlines()]
        assert [line for line in out.splitlines() if "SUCCEEDED" in line and "train" in line]
    finally:
        state = read_state(home)
        if state is not None and state.alive():
            os.kill(state.pid, 15)  # the server, by its recorded pid
            wait_until(lambda: not state.alive(), 15, f"server {state.pid} to stop")
    assert states and states[0] is not None, "no record of the simulated account's server"
    assert not states[0].alive()
    assert read_state(home) is None
    assert _mounts_under(tmp_path) == []
    records = [json.loads(p.read_text()) for p in home.glob("cloud/instances/*/i-*.json")]
    assert not [r for r in records if r["pid"] is None or is_alive(r["pid"], r["ticks"])]
    # Read-only commands, right after the account stopped, start nothing: no server, no
    # process of this flow directory.
    printed: dict[str, str] = {}
    for argv in (["flow", "list"], ["flow", "pool", "list"], ["flow", "gc", "--dry-run"],
                 ["flow", "list", "--json"]):
        before = _processes_naming(tmp_path)
        printed[" ".join(argv[1:])] = _run(argv, env, tmp_path)
        assert read_state(home) is None, f"{argv} started the simulated account"
        assert _processes_naming(tmp_path) == before == [], argv
    assert "aws-sim: nothing to reclaim" in printed["gc --dry-run"]
    # what this machine last saw of the rehearsal's tasks, not UNKNOWN
    rows = json.loads(printed["list --json"])
    assert rows and all(r["status"] == "SUCCEEDED" and r["last_known"] for r in rows), rows


def _processes_naming(root: Path) -> list[int]:
    """Pids of the processes whose command line or environment names ``root``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if str(root).encode() in text:
            found.append(int(entry.name))
    return sorted(found)
