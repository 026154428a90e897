"""Scripts as tasks: ``flow run FILE.py``, ``app.submit_file`` and ``app.submit_directory``.

The client packs the script, or a whole directory, into a ``ScriptBundle`` (a zip archive in
memory, stored with the payload). The task's function is the node's
``flow_sdk.node.scripts.run_bundle(bundle)``, named by :data:`RUN_BUNDLE`: on every worker
(or on the head only, with ``run_on="head"``) it changes into the bundle's directory on the
node (``code/`` in the node's working directory, unpacked once and kept for the life of the
task on that node, restarts included), sets ``sys.argv`` and runs the entry point as
``__main__`` (runpy), with the rendezvous environment already set, so
``torch.distributed.init_process_group()`` works as under torchrun. The script's
``__return__`` global, if it sets one, is its result.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from flow_sdk.errors import FieldProblem, ValidationError
from flow_sdk.payload import NodeEntry
from flow_sdk.wire.bundle import ScriptBundle

MAX_BUNDLE_BYTES = 256 * 2**20
# Never shipped with a directory: version control, caches and virtual environments.
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".mypy_cache",
                       ".pytest_cache", ".ruff_cache", ".tox", ".ipynb_checkpoints",
                       "node_modules"})
# What a script task calls on every worker, named so this side never imports node code.
RUN_BUNDLE = NodeEntry("flow_sdk.node.scripts", "run_bundle")


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

