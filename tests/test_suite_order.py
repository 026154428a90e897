"""The suite's own order and durations file (``tests/conftest.py``): the long tests dealt out
among the runners, and ``--store-durations`` merging a run's seconds into the file."""

from __future__ import annotations

from flow_testing import dealt_longest_first, merged_durations


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
