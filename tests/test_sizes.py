"""Size limits of the library: no module over 400 lines, no function over 60 lines.

A function is measured from its ``def`` line to its last line; methods and nested functions
count on their own. A function may exceed the limit only if it is listed in ``ALLOWED`` below
with a one-line reason; an entry whose function is gone or back under the limit fails too, so
the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "flow_sdk"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

# "path/relative/to/flow_sdk.py:qualified.name" -> why it may stay longer than the limit.
ALLOWED: dict[str, str] = {}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _functions(source: str) -> list[tuple[str, int]]:
    """``(qualified name, length in lines)`` of every def and async def in ``source``."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    end = child.end_lineno if child.end_lineno is not None else child.lineno
                    found.append((name, end - child.lineno + 1))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


SAMPLE = """\
@decorator
def top(a,
        b):
    def inner():
        return 1
    return inner


class Outer:
    class Inner:
        async def method(self):
            if True:
                pass
"""


def test_functions_are_measured_from_def_to_last_line_with_qualified_names() -> None:
    assert _functions(SAMPLE) == [("top", 5), ("top.inner", 2), ("Outer.Inner.method", 3)]
    assert len(_modules()) > 50 and PACKAGE / "client" / "app.py" in _modules()


def test_no_module_is_over_the_line_limit() -> None:
    too_long = {}
    for path in _modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            too_long[str(path.relative_to(PACKAGE))] = lines
    assert too_long == {}, f"modules over {MAX_MODULE_LINES} lines; split them by job"


def test_no_function_is_over_the_line_limit_unless_listed_with_a_reason() -> None:
    too_long: dict[str, int] = {}
    for path in _modules():
        for name, lines in _functions(path.read_text(encoding="utf-8")):
            if lines > MAX_FUNCTION_LINES:
                too_long[f"{path.relative_to(PACKAGE)}:{name}"] = lines
    unlisted = {key: lines for key, lines in too_long.items() if key not in ALLOWED}
    assert unlisted == {}, f"functions over {MAX_FUNCTION_LINES} lines; split them"
    stale = sorted(set(ALLOWED) - set(too_long))
    assert stale == [], "allow-list entries no longer over the limit (or gone); remove them"
    assert all(reason.strip() for reason in ALLOWED.values())
