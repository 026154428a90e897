"""The bootstrap's own log as ``_bootlog`` reads it: ``"<epoch microseconds> <line>"`` lines
past the count in ``<log>.shipped``; a line counts as shipped only once it was handed over."""

from __future__ import annotations

from pathlib import Path

import pytest

from flow_sdk.providers.aws._bootlog import mark_shipped, script_records


def test_only_the_lines_past_the_mark_are_read_with_their_stamps(tmp_path: Path) -> None:
    log = tmp_path / "boot.log"
    log.write_text("1700000000000000 first\n1700000001500000 second\nno-stamp third\n")
    records, count = script_records(log)
    assert count == 3
    assert [(r.ts, r.text) for r in records] == [(1700000000.0, "first"),
                                                 (1700000001.5, "second"), (0.0, "third")]
    mark_shipped(log, 2)
    assert [r.text for r in script_records(log)[0]] == ["third"]
    with log.open("a") as more:
        more.write("1700000002000000 \n")  # an empty line is shipped as one blank
    assert [r.text for r in script_records(log)[0]] == ["third", " "]


def test_a_junk_mark_is_an_error_not_a_silent_skip(tmp_path: Path) -> None:
    log = tmp_path / "boot.log"
    log.write_text("1700000000000000 first\n")
    (tmp_path / "boot.log.shipped").write_text("x")
    with pytest.raises(ValueError):
        script_records(log)
