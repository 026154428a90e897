"""Every ``FLOW_*`` environment variable is declared once, in ``wire.envvars``, with a line of
doc; no other module of the package names one by literal, and every declared one is used."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from flow_sdk.wire import envvars

PACKAGE = Path(envvars.__file__).resolve().parents[1]
DECLARING = Path(envvars.__file__).resolve()
TEMPLATE = PACKAGE / "providers" / "aws" / "bootstrap.sh.tmpl"
NAME = re.compile(r"FLOW_[A-Z0-9_]*")  # a variable, or the prefix alone


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.resolve() != DECLARING)


def _constants() -> dict[str, str]:
    return {attr: value for attr, value in vars(envvars).items()
            if attr.isupper() and isinstance(value, str) and attr != "PREFIX"}


def test_no_other_module_names_a_flow_variable_by_literal() -> None:
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and NAME.fullmatch(node.value):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
    assert found == [], "name these through flow_sdk.wire.envvars:\n" + "\n".join(found)


def test_a_literal_outside_the_module_is_found() -> None:
    """The scan above sees a plain literal, an f-string's text and a dict key."""
    tree = ast.parse('os.environ.get("FLOW_X"); f"FLOW_{y}"; {"FLOW_Z": 1}')
    seen = [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and NAME.fullmatch(n.value)]
    assert sorted(seen) == ["FLOW_", "FLOW_X", "FLOW_Z"]


def test_every_variable_is_declared_once_with_its_doc_and_used() -> None:
    constants = _constants()
    assert sorted(constants.values()) == sorted(envvars.DOCS)  # each declared once
    assert all(len(doc) > 10 for doc in envvars.DOCS.values())
    assert envvars.USER_SETTABLE <= set(envvars.DOCS)
    code = "\n".join(p.read_text(encoding="utf-8") for p in _modules())
    unused = [attr for attr in constants if not re.search(rf"\benvvars\.{attr}\b", code)]
    assert unused == []


def test_what_the_aws_bootstrap_exports_to_the_node_is_declared() -> None:
    """The bootstrap (bash) hands the agent its variables by ``export``; each is declared."""
    exported = re.findall(r"^\s*export\s+(FLOW_[A-Z0-9_]+)", TEMPLATE.read_text(), re.M)
    assert exported and set(exported) <= set(envvars.DOCS), set(exported) - set(envvars.DOCS)
