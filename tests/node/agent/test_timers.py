"""The agent's timers: a periodic check is due at once, then once per period; a deadline has
passed from its moment on."""

from __future__ import annotations

import time

from flow_sdk.node.agent.timers import Deadline, Every


def test_a_check_is_due_at_once_then_once_per_period() -> None:
    check = Every(2.0)
    assert check.due(100.0)
    assert not check.due(100.0)
    assert not check.due(101.9)
    assert check.due(102.0)  # the next one counts from here
    assert not check.due(103.5)
    assert check.due(104.1)


def test_a_deadline_passes_at_its_moment() -> None:
    deadline = Deadline(50.0)
    assert not deadline.passed(49.99)
    assert deadline.passed(50.0)
    assert deadline.passed(51.0)


def test_a_deadline_after_counts_from_now_on_the_monotonic_clock() -> None:
    before = time.monotonic()
    deadline = Deadline.after(30.0)
    assert before + 30.0 <= deadline.at <= time.monotonic() + 30.0
    assert not deadline.passed()
    assert Deadline.after(0.0).passed()
