"""The suite's own order, durations file and tiers (``tests/conftest.py``): the long tests dealt
out among the runners, ``--store-durations`` merging a run's seconds into the file, and the
extended tier that ``extended.txt`` lists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flow_testing import dealt_longest_first, listed_node_ids, merged_durations
from flow_testing import TIER_LISTED, unknown_node_ids

HERE = Path(__file__).resolve().parent


def test_each_runners_slice_starts_with_its_share_of_the_long_tests() -> None:
    seconds = {"a": 90.0, "b": 60.0, "c": 50.0, "d": 20.0, "e": 10.0, "f": 5.0}
    names = ["f", "e", "quick", "d", "c", "b", "a", "also-quick", "unlisted"]
    order = dealt_longest_first(names, seconds, runners=3)
    assert sorted(order) == sorted(names)
    slices = [order[0:3], order[3:6], order[6:9]]  # worksteal's first hand-out
    assert [s[0] for s in slices] == ["a", "b", "c"]  # the three longest, one each
    assert [s[1] for s in slices] == ["d", "e", "f"]
    assert all(seconds.get(s[-1], 0.0) == 0.0 for s in slices)  # each ends short
    assert dealt_longest_first(names, seconds, runners=1) == \
        ["a", "b", "c", "d", "e", "f", "quick", "also-quick", "unlisted"]


def test_a_run_s_seconds_replace_the_listed_ones_and_short_tests_leave_the_file() -> None:
    listed = {"t::slow": 30.0, "t::kept": 4.0, "t::became_quick": 12.0}
    timed = {"t::slow": 41.26, "t::became_quick": 0.3, "t::new": 2.04, "t::quick": 0.01}
    assert merged_durations(listed, timed) == {"t::kept": 4.0, "t::new": 2.0, "t::slow": 41.3}


def test_the_tier_list_reads_one_id_per_line_and_names_unknown_ids_of_collected_files() -> None:
    text = "# the reason\n\na.py::test_one  # a note\n  b.py::test_two[x]\n"
    assert listed_node_ids(text) == ["a.py::test_one", "b.py::test_two[x]"]
    collected = ["a.py::test_one", "a.py::test_three", "c.py::test_four"]
    assert unknown_node_ids(["a.py::test_one", "a.py::test_gone", "b.py::test_two[x]"],
                            collected) == ["a.py::test_gone"]  # b.py was not collected


def _pytest(*args: str) -> tuple[list[str], str]:
    """A run of pytest with ``args`` (none of the project's own options): the test ids it
    lists (``--collect-only``), and its whole output."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
                          "addopts=", *args], cwd=HERE.parent, capture_output=True, text=True,
                         timeout=120)
    return [line for line in out.stdout.splitlines() if "::" in line], out.stdout + out.stderr


def test_each_listed_test_this_run_collected_is_live_and_left_out_unless_asked(
        request: pytest.FixtureRequest) -> None:
    """What the test command leaves out is a live test (marked ``slow``), never a fast one:
    this very run left out each listed test it collected, unless ``--extended`` was given.
    The test command collects every file, so there this covers the whole list."""
    listed = listed_node_ids((HERE / "extended.txt").read_text())
    assert listed and len(listed) == len(set(listed))
    collected = request.config.stash[TIER_LISTED]
    assert all(collected.values()), \
        f"not marked slow: {[nodeid for nodeid, slow in collected.items() if not slow]}"
    running = {item.nodeid for item in request.session.items}
    if not request.config.getoption("extended"):
        assert not set(collected) & running
    files = {nodeid.split("::", 1)[0] for nodeid in running | set(collected)}
    if {nodeid.split("::", 1)[0] for nodeid in listed} <= files:
        assert sorted(collected) == sorted(listed)


def test_a_run_says_how_many_it_left_out_and_the_option_brings_them_back() -> None:
    """The same from the command line, on one file of the list: a run with a runner, as the
    test command's (xdist's controller collects nothing, so the runner reports the count),
    ends saying how many listed tests it left out; ``--extended -m extended`` selects exactly
    the listed ones."""
    page = "tests/test_readme_blocks.py"
    listed = [nodeid for nodeid in listed_node_ids((HERE / "extended.txt").read_text())
              if nodeid.startswith(f"{page}::")]
    assert listed
    _, output = _pytest("-n", "1", page, "-k", "marked_block")
    assert " passed" in output and " failed" not in output, output[-4000:]
    assert f"{len(listed)} tests of the extended tier (extended.txt) were left out; " \
           "python3 -m pytest -q --extended runs them" in output, output[-4000:]
    chosen, output = _pytest("--collect-only", "--extended", "-m", "extended", page)
    assert sorted(chosen) == sorted(listed), output[-4000:]
    assert "were left out" not in output
