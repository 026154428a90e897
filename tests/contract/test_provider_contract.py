"""The shipped provider contract suite (``flow_sdk.testing.suite``) on ``local`` and ``aws-sim``
(see conftest.py), and the suite run by a provider's name as a third party runs it."""

from __future__ import annotations

import subprocess
import sys

from flow_sdk.testing.suite import (  # noqa: F401  (the suite's tests, collected here)
    test_a_launch_that_gets_part_of_its_gang_starts_none_of_it,
    test_a_two_node_task_runs_end_to_end_and_leaves_nothing,
    test_gc_leaves_a_running_task_and_reclaims_it_once_ended_after_a_dry_run,
    test_named_volumes_are_made_once_listed_and_deleted_or_refused,
    test_the_log_store_pages_with_a_cursor_and_keeps_every_line,
    test_the_object_store_round_trips_and_lists_in_order,
)


def test_the_suite_runs_against_a_provider_by_name() -> None:
    """``python -m flow_sdk.testing local`` with pytest's own options (the stores' tests
    here; the tasks' tests run above)."""
    run = subprocess.run([sys.executable, "-m", "flow_sdk.testing", "local", "-q", "-p",
                          "no:cacheprovider", "-k", "store", "-n0"], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "2 passed" in run.stdout, run.stdout[-3000:]


def test_the_suite_without_a_provider_says_how_to_name_one() -> None:
    run = subprocess.run([sys.executable, "-m", "flow_sdk.testing"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "NAME" in run.stderr

