"""Running a script task on a node: unpack the bundle the caller shipped and run its entry
point as ``__main__`` (the caller's side, which bundles it, is ``flow_sdk.client.scripts``)."""

from __future__ import annotations

import fcntl
import io
import os
import runpy
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from flow_sdk.errors import ScriptExitError
from flow_sdk.wire.bundle import ScriptBundle
from flow_sdk.wire import envvars

CODE_DIR = "code"  # the bundle's folder in a node's working directory
_UNPACKED = ".flow-unpacked"


def _task_code_dir(bundle: ScriptBundle) -> Path:
    """``code/`` in the node's working directory (the workers' start directory), unpacked once
    per node and shared by its workers and by every generation of the task, so relative paths
    a script writes (``snapshot.pt``) are there after a restart."""
    root = Path(os.getcwd()) / CODE_DIR
    with open(Path(os.getcwd()) / f"{CODE_DIR}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the node's workers start together: one unpacks
        if not (root / _UNPACKED).exists():
            _unpack(bundle, root)
            (root / _UNPACKED).touch()
    return root


def _unpack(bundle: ScriptBundle, root: Path) -> None:
    with zipfile.ZipFile(io.BytesIO(bundle.archive)) as archive:
        archive.extractall(root)


def run_bundle(bundle: ScriptBundle) -> Any:
    """Run the entry point as ``__main__`` from the bundle's directory and return the script's
    ``__return__`` (``None`` when it sets none). ``sys.exit(0)`` counts as success; another
    code raises ScriptExitError. Inside a task the directory is the node's (``_task_code_dir``);
    outside one, a temporary directory removed when the script ends."""
    if envvars.TASK_ID in os.environ:
        return _run(bundle, _task_code_dir(bundle))
    with tempfile.TemporaryDirectory(prefix="flow-code-") as scratch:
        _unpack(bundle, Path(scratch))
        return _run(bundle, Path(scratch))


def _run(bundle: ScriptBundle, root: Path) -> Any:
    script = root / bundle.entrypoint
    saved_argv, saved_path, saved_cwd = sys.argv[:], sys.path[:], os.getcwd()
    sys.argv = [str(script), *bundle.args]
    sys.path.insert(0, str(script.parent))
    os.chdir(root)
    try:
        namespace = runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            return None
        if isinstance(exc.code, int):
            raise ScriptExitError(f"{bundle.entrypoint} exited with code {exc.code}",
                                  exc.code) from None
        print(exc.code, file=sys.stderr)
        raise ScriptExitError(f"{bundle.entrypoint} exited: {exc.code}", 1) from None
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)
    return namespace.get("__return__")
