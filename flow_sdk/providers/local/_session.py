"""An SSH session on a local node: the ``ForceCommand`` of the node's sshd.

sshd runs ``python -I -S _session.py SSH_DIR`` for every session: it changes to the node's
working directory, sets the node's environment (the agent's, plus the node's rank variables
read from the node records the agent publishes in the store, plus the task's
``environment``) and runs the requested command, or an interactive shell, in the user's shell.

Only the standard library may be imported here: sshd runs this file by path, without
site-packages (the ``FLOW_*`` names come from ``flow_sdk/wire/envvars.py``, run by its path).
"""

from __future__ import annotations

import json
import os
import pwd
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import NoReturn

if __package__:
    from flow_sdk.wire import envvars
else:  # sshd runs this file by path, without the package: its one module of FLOW_* names
    envvars = SimpleNamespace(**runpy.run_path(  # type: ignore[assignment]
        str(Path(__file__).resolve().parents[2] / "wire" / "envvars.py")))

SESSION_FILE = "session.json"  # the session settings, in the node's SSH directory
# Variables an SSH session keeps from sshd rather than taking the node's value.
_SESSION_KEEP = ("TERM", "USER", "LOGNAME", "MAIL")


def command(python: str, ssh_dir: Path) -> list[str]:
    """The command line sshd runs for every session of the node whose files are in ``ssh_dir``."""
    return [python, "-I", "-S", str(Path(__file__).resolve()), str(ssh_dir)]


def _node_records(nodes_dir: Path) -> list[dict[str, object]]:
    records = []
    if nodes_dir.is_dir():
        for path in sorted(nodes_dir.glob("*.json")):
            try:
                records.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue  # a record being replaced right now; the others still count
    return records


def session_env(settings: dict[str, object], login_env: dict[str, str]) -> dict[str, str]:
    """The environment of an SSH session on a node: the node agent's environment, the
    session variables sshd set (``SSH_*``, ``TERM``, ...), the node's ``FLOW_*`` rank
    variables from the node records in the store, then the task's ``environment``."""
    env = {str(k): str(v) for k, v in dict(settings["env"]).items()}  # type: ignore[call-overload]
    env.update({k: v for k, v in login_env.items() if k.startswith("SSH_") or k in _SESSION_KEEP})
    instance_id = str(settings["instance_id"])
    records = _node_records(Path(str(settings["nodes_dir"])))
    mine = [r for r in records if r.get("instance_id") == instance_id]
    if mine:
        leader = [r for r in records if r.get("node") == 0]
        env[envvars.TASK_ID] = str(settings["task_id"])
        env[envvars.NODE_RANK] = str(mine[0]["node"])
        env[envvars.NUM_NODES] = str(len(records))
        if leader:
            env[envvars.MAIN_IP] = str(leader[0]["address"])
    task_file = Path(str(settings["task_file"]))
    if task_file.is_file():
        spec = json.loads(task_file.read_text()).get("spec", {})
        env.update({str(k): str(v) for k, v in (spec.get("environment") or {}).items()})
    return env


def session(ssh_dir: Path) -> NoReturn:
    """Run the SSH client's command (or a shell) in the node's directory and environment."""
    settings = json.loads((ssh_dir / SESSION_FILE).read_text())
    env = session_env(settings, dict(os.environ))
    workdir = str(settings["workdir"])
    try:
        os.chdir(workdir)
    except OSError as exc:
        print(f"flow: node working directory {workdir} is gone ({exc}); the node has ended",
              file=sys.stderr)
        sys.exit(1)
    shell = os.environ.get("SHELL") or pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
    requested = os.environ.get("SSH_ORIGINAL_COMMAND")
    if requested:
        argv = [shell, "-c", requested]
    else:
        argv = [shell, "-i"] if os.isatty(0) else [shell]
    os.execve(shell, argv, env)


def main(argv: Sequence[str]) -> int:
    if len(argv) == 1:
        session(Path(argv[0]))
    print("usage: _session.py SSH_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
