"""The local modules a script imports from its own directory, found by reading its imports
(``ast``), so that ``flow run train.py`` ships ``datautils.py`` beside it.

A module counts as local when ``NAME.py`` or a folder ``NAME/`` sits in the script's
directory; a local package travels whole. Imports the reader cannot resolve (a relative
import, ``importlib.import_module(name)`` with a computed name) stop the launch with an error
naming the module and the directory form, which ships the whole folder.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from flow_sdk.errors import FieldProblem, ValidationError

_SKIP_DIRS = frozenset({"__pycache__", ".git", ".venv", "venv", "node_modules"})
_DYNAMIC = frozenset({"import_module", "__import__"})


def _directory_form(script: Path, what: str) -> ValidationError:
    folder = script.parent
    return ValidationError([FieldProblem("path", (
        f"{script.name} {what}, so flow cannot tell which files beside it to ship; ship "
        f"the whole directory instead: `flow run --entrypoint {script.name} {folder}` "
        f"(in Python: app.submit_directory({str(folder)!r}, entrypoint={script.name!r}))"))])


def imported_names(source: Path, in_package: bool = False) -> set[str]:
    """Top-level names of the modules ``source`` imports. Raises ValidationError for an
    import by a computed name, and for a relative import outside a package (``in_package``:
    the file belongs to a local package, which travels whole)."""
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    except SyntaxError as exc:
        raise ValidationError([FieldProblem("path", (
            f"{source}, line {exc.lineno}: {exc.msg}; fix the syntax error before "
            "launching"))]) from None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level and not in_package:
                raise _directory_form(source, f"uses a relative import (line {node.lineno}: "
                                              f"from {'.' * node.level}{node.module or ''})")
            if not node.level:
                names.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Call) and _dynamic_name(node.func) in _DYNAMIC:
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.add(first.value.split(".")[0])
            else:
                raise _directory_form(source, f"imports a module by a computed name (line "
                                              f"{node.lineno}: {_dynamic_name(node.func)})")
    names.discard("")
    return names


def _dynamic_name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _package_files(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        found.extend(Path(root) / f for f in sorted(files) if f.endswith(".py"))
    return found


def local_module_files(script: str | os.PathLike[str]) -> list[Path]:
    """Every ``.py`` file of the modules ``script`` imports, directly or through another
    local module, from its own directory (not the script itself), sorted."""
    entry = Path(script).resolve()
    if not entry.is_file():
        return []  # bundling says what is wrong with the path
    folder = entry.parent
    shipped: set[Path] = set()
    todo = [entry]
    seen_names: set[str] = set()
    while todo:
        source = todo.pop()
        in_package = source.parent != folder
        for name in sorted(imported_names(source, in_package) - seen_names):
            seen_names.add(name)
            if (folder / f"{name}.py").is_file():
                files = [folder / f"{name}.py"]
            elif (folder / name).is_dir() and name not in _SKIP_DIRS:
                files = _package_files(folder / name)
            else:
                continue  # installed (or only on the nodes): not ours to ship
            new = [f for f in files if f not in shipped and f != entry]
            shipped.update(new)
            todo.extend(new)
    return sorted(shipped)
