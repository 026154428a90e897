"""A launch that costs money shows its plan and asks first, on a terminal (a real pty):
answering no launches nothing; --yes launches at once. The cloud is the simulated aws one
(moto over HTTP, instances booted through the real bootstrap): the aws tests' own fixtures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from aws_moto_world import AwsWorld
from flow_testing import run_on_terminal

pytestmark = pytest.mark.slow
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _run(aws: AwsWorld, tmp_path: Path, *extra: str,
         answer: tuple[bytes, bytes] | None = None) -> tuple[int, str]:
    script = tmp_path / "hello.py"
    script.write_text("print('hello from the simulated cloud', flush=True)\n")
    config = json.dumps(aws.sim_config())
    code, out = run_on_terminal(["flow", "run", "--provider", "aws-sim", "--provider-config",
                                 config, "-N", "2", "--priority", "high", "--max-run-time-hours", "2",
                                 *extra, str(script)], timeout=180,
                                answers=[answer] if answer is not None else [])
    return code, _ANSI.sub("", out)


def test_the_plan_is_shown_and_no_launches_nothing(aws: AwsWorld, tmp_path: Path) -> None:
    code, text = _run(aws, tmp_path, answer=(b"Launch 2 node(s)", b"n\n"))
    assert code == 3, text
    plan = re.search(r"plan: 2 x (\S+) in us-east-1(?: \(\S+\))?, on-demand, \$([\d.,]+)/h per "
                     r"node = \$([\d.,]+)/h; \$([\d.,]+) at the 2 h runtime cap; prices from "
                     r"the catalog of \d{4}-\d\d-\d\d", text)
    assert plan is not None, text
    per_node, total, at_cap = (float(g.replace(",", "")) for g in plan.groups()[1:])
    assert total == pytest.approx(2 * per_node, abs=0.02)
    assert at_cap == pytest.approx(2 * total, abs=0.02)
    assert "launch declined; nothing was started" in text
    assert aws.instances() == []


def test_yes_launches_without_asking(aws: AwsWorld, tmp_path: Path) -> None:
    code, text = _run(aws, tmp_path, "--yes")
    assert code == 0, text
    assert "plan: 2 x " in text and "Launch 2 node(s)" not in text
    assert "hello from the simulated cloud" in text and "SUCCEEDED" in text
    assert aws.non_terminated() == []  # torn down
