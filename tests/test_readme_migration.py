"""Every line of the README's migration tables names tests that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Coming from torchrun"


def test_every_migration_table_line_names_existing_tests() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", 1)]
    rows = [ln for ln in section.splitlines()
            if ln.startswith("| ") and not ln.startswith("|---") and " | test |" not in ln]
    assert len(rows) >= 20
    for row in rows:
        names = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", row.rsplit("|", 2)[1])
        assert names, f"no test named for: {row}"
        for path, test in names:
            source = (ROOT / path).read_text()
            assert re.search(rf"^def {test}\(", source, re.M), f"{path}::{test} is missing"
