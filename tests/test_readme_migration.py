"""Every line of the migration tables (docs/migration.md, linked from the README) names tests
that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "migration.md"
TOOLS = ("torchrun", "Metaflow `@parallel`", "Snowflake ML Jobs", "SkyPilot", "dstack", "Flow",
         "submitit", "sbatch")


def test_every_migration_table_line_names_existing_tests() -> None:
    text = PAGE.read_text()
    assert [f"| {tool} | flow-sdk | test |" in text for tool in TOOLS] == [True] * len(TOOLS)
    rows = [ln for ln in text.splitlines()
            if ln.startswith("| ") and not ln.startswith("|---") and " | test |" not in ln]
    assert len(rows) >= 20
    for row in rows:
        names = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", row.rsplit("|", 2)[1])
        assert names, f"no test named for: {row}"
        for path, test in names:
            source = (ROOT / path).read_text()
            assert re.search(rf"^def {test}\(", source, re.M), f"{path}::{test} is missing"
