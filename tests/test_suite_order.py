"""The suite's own order, durations file and tiers (``tests/conftest.py``): whole files, the
longest first, to the runners; ``--store-durations`` merging a run's seconds into the file; and
the extended tier that ``extended.txt`` lists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flow_testing import files_longest_first, listed_node_ids, merged_durations
from flow_testing import TIER_LISTED, unknown_node_ids

HERE = Path(__file__).resolve().parent


def test_whole_files_go_longest_first_each_in_its_own_order() -> None:
    seconds = {"b.py::1": 60.0, "a.py::2": 20.0, "a.py::1": 50.0, "c.py::1": 5.0}
    names = ["a.py::1", "quick.py::1", "b.py::1", "a.py::2", "c.py::1", "quick.py::2",
             "a.py::quick", "unlisted.py::1"]
    order = files_longest_first(names, seconds)
    assert sorted(order) == sorted(names)
    # a.py (70 s) before b.py (60 s): files by their sum, each file's tests together and in
    # their order; the files of no listed seconds last, in their order
    assert order == ["a.py::1", "a.py::2", "a.py::quick", "b.py::1", "c.py::1",
                     "quick.py::1", "quick.py::2", "unlisted.py::1"]


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
    # a run of `a.py::test_one` alone collected a.py's other tests not at all
    assert unknown_node_ids(["a.py::test_one", "a.py::test_gone"], ["a.py::test_one"],
                            narrowed={"a.py"}) == []


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
