"""The words people type and the flags errors name: ``--nodes`` is ``-N`` (torchrun's,
Slurm's and SkyPilot's word) for ``flow run``, ``flow plan`` and ``flow pool up``; an error
about the provider's own configuration names ``--provider`` when that is the flag the user
passed, ``--provider-config`` only when they passed it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from flow_testing import fake_aws_environment

from flow_sdk.cli import main
from flow_sdk.client.records import list_client_records
from flow_sdk.providers.aws import _config as aws_config

FLOW = str(Path(sys.executable).with_name("flow"))
RANKS = ("import os\n"
         "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)\n")


@pytest.mark.parametrize("command", [["run"], ["plan"], ["pool", "up"]])
def test_help_lists_nodes_beside_num_instances(command: list[str]) -> None:
    shown = CliRunner().invoke(main, [*command, "--help"])
    assert shown.exit_code == 0
    assert "-N, --num-instances, --nodes INTEGER" in shown.stdout


def test_plan_takes_nodes_as_num_instances() -> None:
    plans = [json.loads(CliRunner().invoke(main, ["plan", *flag, "--json"]).stdout)
             for flag in (["--nodes", "3"], ["-N", "3"], ["--num-instances", "3"])]
    assert plans[0] == plans[1] == plans[2] and plans[0]["nodes"] == 3


@pytest.mark.slow
def test_run_with_nodes_runs_that_many_nodes(tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    ran = subprocess.run([FLOW, "run", "--nodes", "2", str(script)], capture_output=True,
                         text=True, timeout=180, stdin=subprocess.DEVNULL, check=False)
    assert ran.returncode == 0, ran.stderr
    assert sorted(line.split("] ")[-1] for line in ran.stdout.splitlines()) == [
        "rank 0 of 2", "rank 1 of 2"]
    [record] = list_client_records()
    listed = json.loads(CliRunner().invoke(main, ["list", "--json"]).stdout)
    assert [(r["task_id"], r["nodes"]) for r in listed] == [(record["task_id"], 2)]


@pytest.fixture
def other_python_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The default image's Python is not this program's (as for a user on another Python);
    fake AWS credentials, so nothing could reach a real account."""
    fake_aws_environment(monkeypatch, tmp_path)
    theirs = f"3.{sys.version_info.minor + 1}"
    monkeypatch.setattr(aws_config, "DLAMI_PYTHON", theirs)
    return theirs


def _one_line(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, (result.stderr, result.exception)
    [line] = result.stderr.splitlines()
    return line


def test_a_python_mismatch_names_the_flag_the_user_passed(tmp_path: Path,
                                                          other_python_image: str) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    words = f"the nodes' image runs Python {other_python_image}, but this program runs Python"
    line = _one_line(["run", "--provider", "aws", str(script)])
    assert line.startswith(f"flow: --provider: {words}"), line
    assert "--provider-config" not in line
    line = _one_line(["pool", "up", "dev", "--provider", "aws"])
    assert line.startswith(f"flow: --provider: {words}"), line
    # passed, it is the flag to change
    line = _one_line(["run", "--provider", "aws", "--provider-config",
                      json.dumps({"region": "us-east-1"}), str(script)])
    assert line.startswith(f"flow: --provider-config: {words}"), line
    assert list_client_records() == []  # nothing was launched
