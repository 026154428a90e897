"""The shipped provider contract suite (``flow_sdk.testing.suite``) on ``local`` and ``aws-sim``
(see conftest.py), and the suite run by a provider's name as a third party runs it."""

from __future__ import annotations

import subprocess
import sys

from flow_sdk.testing.suite import (  # noqa: F401  (the suite's tests, collected here)
    test_a_file_volume_is_shared_by_every_node_where_the_provider_has_them,
    test_a_launch_that_gets_part_of_its_gang_starts_none_of_it,
    test_a_lost_node_is_replaced_where_the_provider_adds_nodes,
    test_a_two_node_task_runs_end_to_end_and_leaves_nothing,
    test_gc_leaves_a_running_task_and_reclaims_it_once_ended_after_a_dry_run,
    test_named_volumes_are_made_once_listed_and_deleted_or_refused,
    test_the_log_store_pages_with_a_cursor_and_keeps_every_line,
    test_the_object_store_round_trips_and_lists_in_order,
)


def _by_name(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flow_sdk.testing", *args], capture_output=True,
                          text=True, timeout=300)


def test_the_suite_runs_against_a_provider_by_name_with_its_config() -> None:
    """``python -m flow_sdk.testing local --config '{}'`` with pytest's own options (the
    stores' tests here; the tasks' tests run above)."""
    run = _by_name("local", "--config", "{}", "-q", "-p", "no:cacheprovider", "-k", "store",
                   "-n0")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "2 passed" in run.stdout, run.stdout[-3000:]


def test_by_name_the_all_or_none_test_fails_unproven_rather_than_skip() -> None:
    run = _by_name("local", "-q", "-p", "no:cacheprovider", "-k", "part_of_its_gang", "-n0")
    assert run.returncode == 1 and "1 failed" in run.stdout, run.stdout[-3000:]
    assert "all-or-none launch is unchecked for 'local'" in run.stdout
    assert "partial_launch" in run.stdout


def test_the_suite_says_how_to_name_a_provider_and_its_config() -> None:
    bare = _by_name()
    assert bare.returncode == 2 and "NAME" in bare.stderr
    missing = _by_name("local", "--config")
    assert missing.returncode == 2 and "--config needs a JSON object" in missing.stderr
    listed = _by_name("local", "--config", "[1]", "-q", "-p", "no:cacheprovider", "-k",
                      "object_store", "-n0")
    assert listed.returncode != 0
    assert "--flow-provider-config must be a JSON object" in listed.stdout + listed.stderr
