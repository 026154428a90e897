"""Print flow-gang-sdk's direct requirements for an extra, one per line, without torch, as
``pyproject.toml`` lists them (the extras it names followed): what `scripts/setup.sh` installs
at their newest releases, in the same installer run (uv, or pip) that installs the SDK.

    python scripts/direct_requirements.py dev

Standard library only (it runs before anything is installed); Python 3.11 or later (tomllib).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any

DIST = "flow-gang-sdk"
KEEP = {"torch"}  # the set-up's CPU pin stays
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[([^\]]*)\])?")


def direct_requirements(extra: str) -> list[str]:
    """The requirements of ``extra`` and of the extras it names, the plain dependencies
    included, torch and the SDK itself left out."""
    project: dict[str, Any] = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    if extra not in optional:
        raise SystemExit(f"direct_requirements.py: no extra {extra!r} in pyproject.toml; "
                         f"its extras: {', '.join(sorted(optional))}")
    chosen = set(project.get("dependencies", []))
    extras, pending = set(), [extra]
    while pending:
        name = pending.pop()
        if name in extras:
            continue
        extras.add(name)
        for requirement in optional.get(name, []):
            match = _NAME.match(requirement)
            if match and match.group(1) == DIST:
                pending.extend(part.strip() for part in (match.group(3) or "").split(","))
            else:
                chosen.add(requirement)
    return sorted(r for r in chosen if (m := _NAME.match(r)) is None or m.group(1) not in KEEP)


if __name__ == "__main__":
    print("\n".join(direct_requirements(sys.argv[1] if len(sys.argv) > 1 else "all")))
