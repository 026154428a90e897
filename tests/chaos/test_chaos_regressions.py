"""Seeds of the chaos soak (``bench/chaos.py``) that found a bug, replayed after its fix.

Seed 4 (a lone local node's agent SIGKILLed at boot) and seed 20 (a lone local node's keeper
SIGKILLed mid-training, which takes its agent with it) hung: the node had reported itself
running, so ``Task.status`` read RUNNING for ever once its only agent was gone, and
``results()`` waited past every bound. ``Task.status`` now reads FAILED once every instance
of the task has terminated without an outcome. (The simulated cloud's case, a lone node's
agent killed mid-training, is the smoke's ``sigkill-agent`` seed.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import _chaos_run  # noqa: E402
from _chaos_draw import Scenario, draw  # noqa: E402
from _chaos_run import Bench, Result, run_scenario  # noqa: E402
from chaos import replay_command  # noqa: E402

pytestmark = pytest.mark.slow


def _replay(seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str
            ) -> tuple[Scenario, Result, str]:
    """Run the scenario of ``seed`` in a FLOW_HOME of its own; asserts it ended ``status``
    with nothing left, and returns it, its result and its replay command."""
    monkeypatch.setenv("FLOW_HOME", str(tmp_path / "flow-home"))
    scenario = draw(seed)
    with Bench(tmp_path / "chaos", sim=scenario.provider == "aws-sim") as bench:
        result = run_scenario(bench, scenario)
    detail = "\n".join(result.leaks + result.lost + result.notes)
    replay = replay_command(scenario, (None, None))
    assert result.status == status and result.ok, (
        f"{scenario.describe()} -> {result.status} in {result.terminal_s}s:\n{detail}\n"
        f"replay: {replay}")
    return scenario, result, replay


def _short_cap(monkeypatch: pytest.MonkeyPatch, provider: str, cap_s: float) -> None:
    """A runtime cap of ``cap_s`` beyond the job's work (the soak's is 15 s local, 30 s on the
    simulated cloud): the frozen-node seeds wait for the cap and its grace, whatever the cap."""
    avail, boot, _ = _chaos_run.TIMEOUTS[provider]
    monkeypatch.setitem(_chaos_run.TIMEOUTS, provider, (avail, boot, cap_s))


def _stopped_by_the_caller(tmp_path: Path, seed: int, result: Result, replay: str) -> None:
    """The node's agent was frozen (SIGSTOPped as it showed up), so it enforced nothing: the
    caller's guard ended the task, past the cap and its grace."""
    assert any("sigstop-leader: " in note for note in result.notes), (
        f"the agent was never frozen; replay: {replay}\n" + "\n".join(result.notes))
    seen = _chaos_run.events(tmp_path / "chaos" / f"s{seed}")
    assert any(e.get("type") == "TaskTimedOutError" and "the caller stopped it" in e["message"]
               for e in seen), seen


@pytest.mark.parametrize(("seed", "kind"), [(4, "sigkill-leader"), (20, "sigkill-keeper")])
def test_a_lone_node_that_dies_after_reporting_running_fails_the_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, kind: str) -> None:
    scenario, result, replay = _replay(seed, tmp_path, monkeypatch, "FAILED")
    assert (scenario.provider, scenario.nodes, scenario.kinds) == ("local", 1, [kind])
    assert result.struck == 1, f"the fault never struck; replay: {replay}"
    assert result.terminal_s < 15, f"the loss took {result.terminal_s}s to be seen"


def test_cancel_from_another_thread_while_results_waits_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 7 (simulated cloud, 4 nodes, cancelled at boot): the caller's ``cancel()`` (from a
    second thread) and its ``results()`` wait, which saw CANCELLED, tore the task down at the
    same time; one found the security group the other had just deleted, its
    ``InvalidGroup.NotFound`` aborted the teardown, and the task's IAM role and instance
    profile were left. ``Task`` now runs one teardown at a time."""
    scenario, result, replay = _replay(7, tmp_path, monkeypatch, "CANCELLED")
    assert (scenario.provider, scenario.kinds[0]) == ("aws-sim", "cancel")


def test_a_lone_frozen_node_is_timed_out_by_its_caller(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 174 (one local node of 2 workers, its agent frozen by SIGSTOP at boot) hung: the
    runtime cap is enforced by the agent, so no process enforced it, and the node, alive,
    never read as gone. The waiting caller now records TIMED_OUT once the cap has passed by
    ``runtimecap.CALLER`` and tears the node down (frozen processes included)."""
    from flow_sdk.wire import runtimecap

    _short_cap(monkeypatch, "local", 8.0)
    scenario, result, replay = _replay(174, tmp_path, monkeypatch, "TIMED_OUT")
    print(f"seed 174: TIMED_OUT {result.terminal_s}s after the strike, {result.wall_s}s in all")
    assert (scenario.provider, scenario.nodes, scenario.kinds) == ("local", 1, ["sigstop-leader"])
    _stopped_by_the_caller(tmp_path, 174, result, replay)
    assert result.terminal_s < runtimecap.CALLER.grace_s + 30


def test_a_lone_frozen_simulated_node_ends_a_blocking_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 235 (the simulated cloud, one node whose agent is frozen at boot; the caller blocks
    in ``.remote()``) hung in ``.remote()``'s wait for the nodes to come up, which polled a
    status that stayed PROVISIONING. Past the cap and its grace ``Task.status`` now reads
    TIMED_OUT, so every wait ends and the caller records it and tears the node down."""
    _short_cap(monkeypatch, "aws-sim", 20.0)
    scenario, result, replay = _replay(235, tmp_path, monkeypatch, "TIMED_OUT")
    print(f"seed 235: TIMED_OUT {result.terminal_s}s after the strike, {result.wall_s}s in all")
    assert (scenario.provider, scenario.nodes, scenario.kinds[0]) == (
        "aws-sim", 1, "sigstop-leader")
    _stopped_by_the_caller(tmp_path, 235, result, replay)


def test_a_launch_whose_caller_was_killed_gets_an_outcome_from_gc(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 47 (the simulated cloud, the caller SIGKILLed mid-launch): `flow gc` reclaimed
    everything the launch started, but nothing recorded how the task ended, so it read PENDING
    for ever (its client record is on this machine: no orphan). `flow gc` now records
    CANCELLED for a launch whose client stopped renewing its lease, once nothing of it runs."""
    scenario, result, replay = _replay(47, tmp_path, monkeypatch, "CANCELLED")
    assert (scenario.provider, scenario.kinds[0]) == ("aws-sim", "caller-sigkill")
