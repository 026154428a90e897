"""`scripts/setup.sh` installs every direct dependency at its newest release, torch excepted,
in the installer run that installs the SDK: the list it hands uv (or pip)
(`scripts/direct_requirements.py`, read from pyproject.toml before anything is installed) is
exactly what the installed SDK's metadata requires for the extra, its nested extras followed."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from importlib.metadata import requires
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


def _from_metadata(extra: str) -> set[str]:
    """What the installed SDK's metadata requires for ``extra`` (and the extras it names),
    torch and the SDK itself left out."""
    lines = [line.partition(";") for line in requires("flow-gang-sdk") or []]
    found = {req.strip() for req, _, marker in lines if not marker.strip()}
    pending, seen = [extra], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for req, _, marker in lines:
            owner = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
            if owner is None or owner.group(1) != name:
                continue
            nested = SELF.match(req.strip().replace(" ", ""))
            if nested:
                pending.extend(part.strip() for part in nested.group(1).split(","))
            else:
                found.add(req.strip())
    return {r for r in found if not r.startswith(("torch", "flow-gang-sdk"))}


def _normal(requirement: str) -> str:
    """``pydantic>=2.5,<3`` and ``pydantic<3,>=2.5`` alike; extras sorted."""
    match = re.match(r"^([A-Za-z0-9._-]+)(\[[^\]]*\])?(.*)$", requirement.replace(" ", ""))
    assert match is not None, requirement
    extras = ",".join(sorted(filter(None, (match.group(2) or "").strip("[]").split(","))))
    return f"{match.group(1).lower()}[{extras}]{','.join(sorted(match.group(3).split(',')))}"


@pytest.mark.parametrize("extra", ["all", "dev"])
def test_the_list_is_the_installed_requirements_for_the_extra_but_torch(extra: str) -> None:
    listed = _module().direct_requirements(extra)
    assert {_normal(r) for r in listed} == {_normal(r) for r in _from_metadata(extra)}
    assert not any(r.startswith(("torch", "flow-gang-sdk")) for r in listed)


def test_the_script_prints_one_requirement_per_line() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "all"], capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.splitlines() == _module().direct_requirements("all")


def test_an_extra_pyproject_lacks_is_refused_naming_the_ones_it_has() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "gpu"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1 and not done.stdout
    assert "no extra 'gpu' in pyproject.toml; its extras: all, aws, data, dev" in done.stderr
