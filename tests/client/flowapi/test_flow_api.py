"""Flow's client API on top of FlowApp: task configs, ``Flow(provider=...)``, mounts refused
before launch, and ``intranode_interconnect`` checked against the GPU catalog (the guide's
high-performance decorator planned on AWS's catalog, since it needs SXM H100s)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flow_sdk import Flow, FlowApp, TaskConfig, ValidationError, current
from flow_sdk.catalog import GPU_MODELS, INTRANODE_INTERCONNECTS
from flow_sdk.spec import build_task_spec
from flow_sdk.client.records import list_client_records

app = FlowApp("flow-api")
SAME_PYTHON = {"image_python": f"{sys.version_info[0]}.{sys.version_info[1]}"}
_BESIDE = Path(sys.executable).with_name("flow")
FLOW = str(_BESIDE) if _BESIDE.exists() else (shutil.which("flow") or "flow")


@app.function(num_instances=2)
def which(offset: int, scale: int = 1) -> int:
    return (current.node_index + offset) * scale


def test_task_config_carries_the_spec_and_the_call() -> None:
    config = which._build_task_config("", 5, scale=3)
    assert isinstance(config, TaskConfig)
    assert config.spec == which.spec and config.spec.name == "which"  # "": the function's name
    assert (config.args, config.kwargs) == ((5,), {"scale": 3})
    named = which._build_task_config("nightly-eval")
    assert named.spec.name == "nightly-eval" and named.spec.num_instances == 2
    assert which.spec.name == "which"  # the function itself is unchanged


@pytest.mark.slow
def test_flow_with_its_own_provider_runs_a_named_config() -> None:
    flow = Flow(provider="local", provider_config={"ssh": False})
    task = flow.run(which._build_task_config("nightly-eval", 5, scale=3))
    assert task.task_id.startswith("nightly-eval-")
    assert task.results(timeout=120) == [15, 18]
    assert task.provider.config()["ssh"] is False
    again = flow.get_task(task.task_id)
    assert (again.num_instances, again.max_price_per_hour) == (2, None)


@pytest.mark.parametrize(("flow", "mounts", "field", "words"), [
    (Flow(), {"/data": "http://example.com/x"}, "mounts", "must be an S3 URI"),
    (Flow(), {"/etc": "s3://bucket/x"}, "mounts", "system directory"),
    (Flow(), ["s3://bucket/x"], "mounts", "dictionary"),
    (Flow(provider="nope"), None, "provider", "nope"),
])
def test_bad_mounts_or_provider_are_refused_before_anything_launches(
        flow: Flow, mounts: Any, field: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        flow.run(which._build_task_config("", 1), mounts=mounts)
    [problem] = caught.value.problems
    assert problem.field.split(".")[0] == field and words in problem.message
    assert list_client_records() == []


def test_intranode_interconnect_follows_the_gpu_catalog() -> None:
    for model in GPU_MODELS:
        for form, link in zip(model.form_factors, model.intranode, strict=True):
            spec = build_task_spec(app="a", name="n", gpu=f"{model.name}.{form}:1",
                                   intranode_interconnect=link.upper())
            assert spec.intranode_interconnect == link
    assert set(INTRANODE_INTERCONNECTS) == {"pcie", "sxm2", "sxm4", "sxm5", "sxm6"}
    cases = {
        ("a10g:4", "SXM5"): "allowed for a10g: pcie); sxm5 comes with h200, h100 GPUs",
        ("h100.pcie:8", "SXM5"): "ask for gpu='h100-80gb.sxm:8' to get sxm5",
        ("a100:8", "sxm5"): "links its GPUs over sxm4, not sxm5",
        (None, "sxm5"): "drop it for CPU nodes",
        ("any:2", "sxm5"): "needs a named GPU model",
        ("h100:8", "nvswitch"): "the catalog knows pcie, sxm2, sxm4, sxm5, sxm6",
    }
    for (gpu, link), words in cases.items():
        with pytest.raises(ValidationError) as caught:
            build_task_spec(app="a", name="n", gpu=gpu, intranode_interconnect=link)
        [problem] = caught.value.problems
        assert problem.field == "intranode_interconnect" and words in problem.message


def test_high_performance_decorator_is_accepted_and_planned_on_sxm5_instances() -> None:
    aws = FlowApp("hpc", provider="aws", provider_config=SAME_PYTHON)

    @aws.function(
        gpu="h100:8",
        num_instances=16,
        internode_interconnect="InfiniBand",
        intranode_interconnect="SXM5",
        environment={"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "3"},
    )
    def high_performance_training() -> None:
        pass

    spec = high_performance_training.spec
    assert (spec.intranode_interconnect, spec.internode_interconnect) == ("sxm5", "infiniband")
    plan = aws.plan(high_performance_training)
    assert (plan.instance_type, plan.nodes) == ("p5.48xlarge", 16)
    with pytest.raises(ValidationError, match="intranode_interconnect: .*allowed for a10g: pcie"):
        aws.function(gpu="a10g:4", intranode_interconnect="SXM5")(high_performance_training.fn)


def _flow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLOW, *args], capture_output=True, text=True, timeout=120,
                          check=False, stdin=subprocess.DEVNULL)


def test_flag_plans_sxm5_and_refuses_a_gpu_without_it() -> None:
    config = json.dumps(SAME_PYTHON)
    ok = _flow("plan", "--provider", "aws", "--provider-config", config, "--gpu", "h100:8",
               "-N", "16", "--interconnect", "infiniband", "--intranode-interconnect", "SXM5",
               "--json")
    assert ok.returncode == 0, ok.stderr
    assert (json.loads(ok.stdout)["instance_type"], json.loads(ok.stdout)["nodes"]) == (
        "p5.48xlarge", 16)
    refused = _flow("plan", "--gpu", "a10g:4", "--intranode-interconnect", "sxm5")
    assert refused.returncode == 2
    assert "--intranode-interconnect: gpu='a10g-24gb.pcie:4' links its GPUs over pcie" \
        in refused.stderr
