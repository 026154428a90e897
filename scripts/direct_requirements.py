"""Print the installed flow-gang-sdk's direct requirements for an extra, one per line, without
torch: what `scripts/setup.sh` upgrades to their newest releases.

    python scripts/direct_requirements.py dev

Standard library only (it runs before anything else is known to be installed).
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import requires

DIST = "flow-gang-sdk"
KEEP = {"torch"}  # the set-up's CPU pin stays
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[([^\]]*)\])?")


def _split(line: str) -> tuple[str, str | None]:
    """A requirement line's requirement (no marker) and the extra its marker names, if any."""
    requirement, _, marker = line.partition(";")
    found = _EXTRA.search(marker)
    return requirement.strip(), found.group(1) if found else None


def direct_requirements(extra: str) -> list[str]:
    lines = [_split(line) for line in requires(DIST) or []]
    extras, pending = set(), [extra]
    while pending:  # the extras this one names, through flow-gang-sdk[...] lines
        name = pending.pop()
        if name in extras:
            continue
        extras.add(name)
        for requirement, owner in lines:
            match = _NAME.match(requirement)
            if owner == name and match and match.group(1) == DIST and match.group(3):
                pending.extend(part.strip() for part in match.group(3).split(","))
    chosen = []
    for requirement, owner in lines:
        match = _NAME.match(requirement)
        if match is None or match.group(1) in (DIST, *KEEP):
            continue
        if owner is None or owner in extras:
            chosen.append(requirement)
    return sorted(set(chosen))


if __name__ == "__main__":
    print("\n".join(direct_requirements(sys.argv[1] if len(sys.argv) > 1 else "all")))
