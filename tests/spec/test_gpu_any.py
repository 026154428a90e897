"""Model-less GPU requests: ``any:N`` (or ``gpu:N``) takes whatever GPUs there are."""

from __future__ import annotations

import pytest

from flow_sdk.errors import ValidationError
from flow_sdk.spec import ANY_GPU_MODEL, GpuSpec, build_task_spec


@pytest.mark.parametrize(("text", "count"), [("any:2", 2), ("gpu:4", 4), ("GPU", 1),
                                             ("any.8x", 8)])
def test_model_less_requests_parse(text: str, count: int) -> None:
    spec = GpuSpec.parse(text)
    assert spec.model == ANY_GPU_MODEL and spec.count == count
    assert str(spec) == f"any:{count}"
    assert GpuSpec.parse(str(spec)) == spec


@pytest.mark.parametrize("text", ["any-80gb:1", "any.sxm:2", "any:0", "any:17"])
def test_model_less_requests_take_only_a_count(text: str) -> None:
    with pytest.raises(ValidationError) as info:
        build_task_spec(app="a", name="f", gpu=text)
    assert info.value.fields == ["gpu"]


def test_one_worker_per_gpu_of_any_model() -> None:
    assert build_task_spec(app="a", name="f", gpu="any:3").slots_per_node == 3
