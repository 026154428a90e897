"""`scripts/setup.sh` upgrades every direct dependency to its newest release, torch excepted:
the list it hands pip (`scripts/direct_requirements.py`, read from the installed metadata) is
exactly pyproject's requirements for the extra, its nested extras followed."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "direct_requirements.py"
SELF = re.compile(r"^flow-gang-sdk\[([^\]]+)\]$")


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("direct_requirements", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _from_pyproject(extra: str) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    found = set(project["dependencies"])
    pending, seen = [extra], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in project["optional-dependencies"][name]:
            nested = SELF.match(requirement)
            if nested:
                pending.extend(part.strip() for part in nested.group(1).split(","))
            else:
                found.add(requirement)
    return {r for r in found if not r.startswith("torch")}


def _normal(requirement: str) -> str:
    """``pydantic>=2.5,<3`` and ``pydantic<3,>=2.5`` alike; extras sorted."""
    match = re.match(r"^([A-Za-z0-9._-]+)(\[[^\]]*\])?(.*)$", requirement.replace(" ", ""))
    assert match is not None, requirement
    extras = ",".join(sorted(filter(None, (match.group(2) or "").strip("[]").split(","))))
    return f"{match.group(1).lower()}[{extras}]{','.join(sorted(match.group(3).split(',')))}"


@pytest.mark.parametrize("extra", ["all", "dev"])
def test_the_list_is_pyprojects_requirements_for_the_extra_but_torch(extra: str) -> None:
    listed = _module().direct_requirements(extra)
    assert {_normal(r) for r in listed} == {_normal(r) for r in _from_pyproject(extra)}
    assert not any(r.startswith(("torch", "flow-gang-sdk")) for r in listed)


def test_the_script_prints_one_requirement_per_line() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "all"], capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.splitlines() == _module().direct_requirements("all")
