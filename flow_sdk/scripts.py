"""Scripts as tasks: ``flow run FILE.py``, ``app.submit_file`` and ``app.submit_directory``.

The client packs the script, or a whole directory, into a ``ScriptBundle`` (a zip archive in
memory, stored with the payload). The task's function is ``run_bundle(bundle)``: on every
worker (or on the head only, with ``run_on="head"``) it changes into the bundle's directory
on the node (``code/`` in the node's working directory, unpacked once and kept for the life of
the task on that node, restarts included), sets ``sys.argv`` and runs the entry point as
``__main__`` (runpy), with the rendezvous environment already set, so
``torch.distributed.init_process_group()`` works as under torchrun. The script's
``__return__`` global, if it sets one, is its result.
"""

from __future__ import annotations

import fcntl
import io
import os
import runpy
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from flow_sdk.errors import FieldProblem, ScriptExitError, ValidationError

MAX_BUNDLE_BYTES = 256 * 2**20
# Never shipped with a directory: version control, caches and virtual environments.
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".mypy_cache",
                       ".pytest_cache", ".ruff_cache", ".tox", ".ipynb_checkpoints",
                       "node_modules"})


@dataclass(frozen=True)
class ScriptBundle:
    """A script (or directory) to run on the nodes, with its command-line arguments."""

    name: str  # the task's name: the entry point's file name without ``.py``
    entrypoint: str  # the script's path inside the archive, POSIX style
    args: tuple[str, ...]
    archive: bytes  # a zip of the file or directory


def _check_args(args: Sequence[str]) -> tuple[str, ...]:
    if isinstance(args, str) or not all(isinstance(a, str) for a in args):
        raise ValidationError([FieldProblem(
            "args", f"args must be a list of strings, e.g. ['--lr', '0.1'], not {args!r}")])
    return tuple(args)


def _task_name(entrypoint: str) -> str:
    return PurePosixPath(entrypoint).stem or "script"


def _sealed(name: str, entrypoint: str, args: tuple[str, ...], buffer: io.BytesIO,
            what: str) -> ScriptBundle:
    data = buffer.getvalue()
    if len(data) > MAX_BUNDLE_BYTES:
        raise ValidationError([FieldProblem(
            "directory", f"{what} packs to {len(data) / 2**20:.0f} MiB, over the "
            f"{MAX_BUNDLE_BYTES // 2**20} MiB limit; keep data out of the code directory "
            "(read it from a volume or S3 mount) and ship only code")])
    return ScriptBundle(name, entrypoint, args, data)


def bundle_file(path: str | os.PathLike[str], args: Sequence[str] = (),
                extra: Sequence[Path] = ()) -> ScriptBundle:
    """Pack one Python file; it runs as ``__main__`` with ``sys.argv = [file, *args]``.
    ``extra``: files beside it (or below its directory) that travel with it."""
    file = Path(path)
    if not file.is_file():
        raise ValidationError([FieldProblem(
            "path", f"{str(path)!r} is not a file; pass the path of a Python script")])
    arguments = _check_args(args)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(file, file.name)
        for other in extra:
            archive.write(other, Path(other).relative_to(file.resolve().parent).as_posix())
    return _sealed(_task_name(file.name), file.name, arguments, buffer, str(file))


def bundle_directory(directory: str | os.PathLike[str], entrypoint: str,
                     args: Sequence[str] = ()) -> ScriptBundle:
    """Pack a directory (without version control, caches and virtual environments);
    ``entrypoint``, a path inside it, runs as ``__main__`` from the directory's root. An
    entry point given from the directory's parent (``project/main.py`` for ``project``, as
    Snowflake writes it) means the same file."""
    root = Path(directory)
    if not root.is_dir():
        raise ValidationError([FieldProblem(
            "directory", f"{str(directory)!r} is not a directory")])
    entry = PurePosixPath(Path(entrypoint).as_posix())
    if (not (root / entry).is_file() and len(entry.parts) > 1
            and entry.parts[0] == root.resolve().name):  # given from the directory's parent
        entry = PurePosixPath(*entry.parts[1:])
    if entry.is_absolute() or ".." in entry.parts or not (root / entry).is_file():
        raise ValidationError([FieldProblem(
            "entrypoint", f"{entrypoint!r} must be the relative path of a file inside "
            f"{str(directory)!r}, e.g. 'train.py' or 'src/main.py'")])
    arguments = _check_args(args)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            for name in sorted(files):
                if name.endswith((".pyc", ".pyo")):
                    continue
                full = Path(folder) / name
                archive.write(full, full.relative_to(root).as_posix())
    return _sealed(_task_name(str(entry)), str(entry), arguments, buffer, str(root))


CODE_DIR = "code"  # the bundle's folder in a node's working directory
_UNPACKED = ".flow-unpacked"


def _code_dir(bundle: ScriptBundle) -> Path:
    """Inside a task: ``code/`` in the node's working directory (the workers' start directory),
    unpacked once per node and shared by its workers and by every generation of the task, so
    relative paths a script writes (``snapshot.pt``) are there after a restart. Outside a
    task: a fresh temporary directory."""
    if "FLOW_TASK_ID" not in os.environ:
        root = Path(tempfile.mkdtemp(prefix="flow-code-"))
        _unpack(bundle, root)
        return root
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
    """Run the entry point as ``__main__`` from the bundle's directory (see ``_code_dir``)
    and return the script's ``__return__`` (``None`` when it sets none). ``sys.exit(0)``
    counts as success; another code raises ScriptExitError."""
    root = _code_dir(bundle)
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
