"""Who enforces the runtime cap, and when: one table (``wire.runtimecap``), each layer a later
backstop than the one before, and every enforcer reading its grace from it (a cloud node's
power-off minutes: ``tests/providers/aws/test_cost_caps.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flow_sdk.client import capguard
from flow_sdk.node.pool.timer import IdleTimer
from flow_sdk.wire import runtimecap
from flow_sdk.wire.runtimecap import AGENT, CALLER, GC, KEEPER, LAYERS, POWER_OFF, SCHEDULER

PACKAGE = Path(runtimecap.__file__).resolve().parents[1]


def test_each_layer_acts_after_the_one_before_and_says_what_it_does() -> None:
    assert LAYERS == (AGENT, CALLER, KEEPER, SCHEDULER, POWER_OFF, GC)
    graces = [layer.grace_s for layer in LAYERS]
    assert graces == sorted(set(graces)) and graces[0] == 0
    assert all(layer.does and layer.name for layer in LAYERS)
    assert POWER_OFF.grace_minutes() * 60 >= POWER_OFF.grace_s  # a minute timer never fires early
    assert AGENT.deadline(100.0, None) is None
    assert GC.deadline(100.0, 0.5) == 100.0 + 1800 + GC.grace_s


def test_no_other_module_keeps_a_cap_grace_of_its_own() -> None:
    """The six places that once each held a grace (15 s, 60 s, 10 min twice, 1 h) read it here."""
    found = [f"{p.relative_to(PACKAGE)}: {m}" for p in PACKAGE.rglob("*.py")
             if p.name != "runtimecap.py"
             for m in re.findall(r"^\s*[A-Z_]*CAP[A-Z_]*GRACE[A-Z_]*\s*=|^\s*RUNTIME_GRACE_S\s*=|"
                                 r"^\s*SHUTDOWN_GRACE_MINUTES\s*=", p.read_text(), re.M)]
    assert found == []


def test_the_caller_steps_in_its_grace_past_the_cap() -> None:
    deadline = CALLER.deadline(1000.0, 1.0)
    assert deadline == 1000.0 + 3600 + CALLER.grace_s
    assert capguard.overdue(deadline, now=deadline - 1) is None
    late = capguard.overdue(deadline, now=deadline)
    assert late is not None and late.status == "TIMED_OUT"
    assert f"by {CALLER.grace_s:.0f} s" in late.message


def test_a_pool_node_holds_its_power_off_for_the_cap_plus_the_same_grace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[float | None] = []
    timer = IdleTimer({})
    monkeypatch.setattr(timer, "_shutdown", asked.append)
    timer.hold(120.0)
    timer.hold(None)
    assert asked == [120.0 + POWER_OFF.grace_minutes() * 60, None]
