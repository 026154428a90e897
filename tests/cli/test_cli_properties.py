"""Hostile CLI arguments: `flow plan` either answers (exit 0) or refuses with a usage or
validation error (exit 2) — never a traceback, never a launch."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flow_sdk.cli import main

arg = st.one_of(st.text(max_size=12), st.sampled_from(
    ["h100:8", "a100-80gb:4", "h100:0", "-1", "0", "nan", "inf", "1e309", "", "--", "-N",
     "/shared/x=ckpt", "/usr=bad", "ckpt", "s3://b/p", "low", "urgent"]))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gpu=arg, nodes=arg, price=arg, hours=arg, priority=arg)
def test_plan_answers_or_refuses_cleanly(flow_home: Path, gpu: str, nodes: str, price: str,
                                         hours: str, priority: str) -> None:
    result = CliRunner().invoke(main, ["plan", "--gpu", gpu, "-N", nodes,
                                       "--max-price-per-hour", price,
                                       "--max-run-time-hours", hours, "--priority", priority])
    assert result.exit_code in (0, 2), (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    assert not (flow_home / "local" / "instances").exists()
