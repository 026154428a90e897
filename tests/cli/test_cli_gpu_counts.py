"""A GPU count no machine is sold with (``h100:9``, ``a10g:12``) is refused before anything
launches, in the same words, by the ``local`` provider (with no GPU, or with GPUs) and by
``aws`` (moto over HTTP: the aws tests' own fixtures); a count some machine has still runs
on a machine without GPUs, one CPU worker per GPU."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from aws_moto_world import AwsWorld
from click.testing import CliRunner

from flow_sdk import FlowApp
from flow_sdk.cli import main
from flow_sdk.errors import ValidationError

pytestmark = pytest.mark.slow  # a moto server, local tasks

H100 = "NVIDIA H100 80GB HBM3"
UNSOLD = {  # request -> the words every provider that uses the catalog refuses it with
    "h100:9": "no machine has 9 h100 GPUs: the largest sold with h100 GPUs has 8 (p5.48xlarge: "
              "8x h100-80gb.sxm; catalog as of ",
    "a10g:12": "no machine has 12 a10g GPUs: the largest sold with a10g GPUs has 8 "
               "(g5.48xlarge: 8x a10g-24gb.pcie; catalog as of ",
}


def _nothing() -> None:
    return None


def _refusal(provider: str, config: dict[str, object] | None, gpu: str) -> str:
    """The message ``@app.function(gpu=...)`` is refused with (it must be refused)."""
    app = FlowApp("counts", provider=provider, provider_config=config)
    with pytest.raises(ValidationError) as info:
        app.function(gpu=gpu, num_instances=2)(_nothing)
    [problem] = info.value.problems
    assert problem.field == "gpu"
    return problem.message


def _plan_line(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["plan", *args])
    return result.exit_code, result.stderr


def _nvidia_smi(folder: Path, monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """This machine as the local provider sees it: ``count`` H100s, per its nvidia-smi."""
    folder.mkdir()
    exe = folder / "nvidia-smi"
    lines = "\\n".join(f"{i}, {H100}" for i in range(count))
    exe.write_text(f"#!/bin/sh\nprintf '{lines}\\n'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("gpu", sorted(UNSOLD))
def test_a_count_no_machine_has_is_refused_alike_on_local_and_aws(
        aws: AwsWorld, flow_home: Path, gpu: str) -> None:
    local = _refusal("local", None, gpu)
    cloud = _refusal("aws", aws.config(), gpu)
    assert local == cloud
    assert local.startswith(UNSOLD[gpu]), local
    assert "num_instances" in local  # the way to more GPUs
    for args in (["--provider", "local"], ["--provider", "aws", "--provider-config",
                                           json.dumps(aws.config())]):
        code, err = _plan_line("--gpu", gpu, "--nodes", "2", *args)
        assert (code, err) == (2, f"flow: --gpu: {local}\n")
    assert aws.instances() == []
    assert not (flow_home / "local" / "instances").exists()  # nothing launched here either


def test_a_machine_with_gpus_refuses_in_the_same_words(
        aws: AwsWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cloud = _refusal("aws", aws.config(), "h100:9")
    _nvidia_smi(tmp_path / "bin", monkeypatch, 8)
    assert _refusal("local", None, "h100:9") == cloud
    # what the machine lacks but a cloud sells: the machine's own words
    assert "this machine has 8 x NVIDIA H100" in _refusal("local", None, "h100:8")


def test_a_count_some_machine_has_runs_as_cpu_workers_without_gpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _nvidia_smi(tmp_path / "bin", monkeypatch, 0)  # a driver that lists no GPU
    for gpu, workers in (("h100:8", 8), ("a10g:4", 4), ("any:12", 12)):
        result = CliRunner().invoke(main, ["plan", "--gpu", gpu, "-N", "2", "--json"])
        assert result.exit_code == 0, result.stderr
        plan = json.loads(result.stdout)
        assert (plan["nodes"], plan["workers_per_node"]) == (2, workers)
