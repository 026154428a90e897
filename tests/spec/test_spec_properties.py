"""Hostile input: every value is either accepted and round-trips, or rejected with a typed
error. Nothing crashes, and nothing is started by declaring a function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flow_sdk import FlowApp, GpuSpec, TaskSpec, ValidationError
from flow_sdk.catalog import GPU_MODELS

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

gpu_like = st.one_of(
    st.text(max_size=24),
    st.builds(lambda name, mem, form, count, style: (
        f"{name}{f'-{mem}gb' if mem else ''}{f'.{form}' if form else ''}"
        + (f":{count}" if style == 0 else f".{count}x" if style == 1 else "")),
        st.sampled_from([m.name for m in GPU_MODELS] + [m.name.upper() for m in GPU_MODELS]
                        + ["h1000", "gpu", ""]),
        st.sampled_from([None, 16, 24, 40, 48, 80, 141, 180, 999]),
        st.sampled_from([None, "sxm", "pcie", "nvl"]),
        st.integers(min_value=-3, max_value=40),
        st.integers(min_value=0, max_value=2)),
)

path_like = st.one_of(
    st.text(alphabet="/abcdeusrtmp.-_ \x00", max_size=20),
    st.sampled_from(["/", "/usr", "/etc/x", "/proc", "/data", "/shared/ckpt", "/a/../b", "//x",
                     "/data/", "relative", "/tmp", "/home", "/shared", "/shared/a"]),
)
volume_like = st.one_of(
    st.fixed_dictionaries({"name": st.text(max_size=70)},
                          optional={"size_gb": st.integers(-5, 100_000),
                                    "interface": st.sampled_from(["file", "block", "nfs", ""])}),
    st.text(max_size=10), st.integers(), st.none(),
)


@SETTINGS
@given(gpu_like)
def test_gpu_spec_parses_and_round_trips_or_raises_value_error(text: str) -> None:
    try:
        spec = GpuSpec.parse(text)
    except ValueError:
        return
    assert GpuSpec.parse(str(spec)) == spec
    assert 1 <= spec.count <= 16


def _declare(options: dict[str, Any]) -> TaskSpec | None:
    try:
        return FlowApp("prop").function(**options)(lambda: None).spec
    except ValidationError as exc:
        assert exc.problems and all(p.field and p.message for p in exc.problems)
        return None


@SETTINGS
@given(gpu=st.one_of(gpu_like, st.none(), st.integers()), nodes=st.integers(-2, 5000),
       price=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
       hours=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)))
def test_any_options_give_a_spec_or_a_typed_error(gpu: Any, nodes: int, price: Any,
                                                  hours: Any) -> None:
    spec = _declare({"gpu": gpu, "num_instances": nodes, "max_price_per_hour": price,
                     "max_run_time_hours": hours})
    if spec is not None:
        assert TaskSpec.model_validate(spec.model_dump(mode="json")) == spec


@SETTINGS
@given(volumes=st.dictionaries(path_like, volume_like, max_size=3),
       mounts=st.dictionaries(path_like, st.one_of(st.text(max_size=30), st.sampled_from(
           ["s3://bucket/prefix", "s3://b", "s3://my-bucket/a/../b", "gs://x/y", "s3://Bad/x"])),
           max_size=3),
       nodes=st.integers(1, 3))
def test_volumes_and_mounts_give_a_spec_or_a_typed_error(volumes: Any, mounts: Any,
                                                         nodes: int) -> None:
    spec = _declare({"volumes": volumes, "mounts": mounts, "num_instances": nodes})
    if spec is None:
        return
    assert TaskSpec.model_validate(spec.model_dump(mode="json")) == spec
    paths = [*spec.volumes, *spec.mounts]
    for a in paths:
        assert a.startswith("/") and ".." not in a.split("/")
        for b in paths:
            assert a == b or not b.startswith(a.rstrip("/") + "/")


def test_declaring_never_starts_anything(flow_home: Path) -> None:
    test_any_options_give_a_spec_or_a_typed_error()
    test_volumes_and_mounts_give_a_spec_or_a_typed_error()
    assert not (flow_home / "local" / "instances").exists()
    assert not (flow_home / "tasks").exists()
