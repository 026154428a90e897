from __future__ import annotations

import math

import pytest

from flow_sdk import FlowApp, GpuSpec, ValidationError
from flow_sdk.spec import build_task_spec, check_mount_path


@pytest.mark.parametrize(("text", "model", "memory", "form", "count"), [
    ("h100:8", "h100", 80, "sxm", 8),
    ("H100:8", "h100", 80, "sxm", 8),
    ("a100-80gb:4", "a100", 80, "sxm", 4),
    ("a100:2", "a100", 40, "sxm", 2),
    ("h100-80gb.sxm.8x", "h100", 80, "sxm", 8),
    ("h100.pcie:2", "h100", 80, "pcie", 2),
    ("a10g", "a10g", 24, "pcie", 1),
    (" l40s:4 ", "l40s", 48, "pcie", 4),
])
def test_gpu_spec_forms(text: str, model: str, memory: int, form: str, count: int) -> None:
    spec = GpuSpec.parse(text)
    assert (spec.model, spec.memory_gb, spec.form_factor, spec.count) == (model, memory, form, count)
    assert GpuSpec.parse(str(spec)) == spec  # the canonical form round-trips


@pytest.mark.parametrize(("text", "fragment"), [
    ("h100:0", "at least 1"),
    ("h100:-1", "at least 1"),
    ("h100:17", "at most 16"),
    ("h999:8", "unknown GPU model 'h999'"),
    ("hundred", "unknown GPU model"),
    ("a100-48gb:8", "comes with 40gb, 80gb"),
    ("t4.sxm:1", "comes as pcie"),
    ("h100::8", "cannot parse"),
    ("", "cannot parse"),
])
def test_gpu_spec_rejections_name_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        GpuSpec.parse(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize(("options", "field", "fragment"), [
    ({"gpu": "h100:0"}, "gpu", "at least 1"),
    ({"num_instances": 0}, "num_instances", "greater than or equal to 1"),
    ({"gpu": "h999:8"}, "gpu", "unknown GPU"),
    ({"max_price_per_hour": -1.0}, "max_price_per_hour", "positive"),
    ({"max_price_per_hour": math.inf}, "max_price_per_hour", "positive"),
    ({"max_run_time_hours": -2}, "max_run_time_hours", "positive"),
    ({"max_run_time_hours": 0}, "max_run_time_hours", "positive"),
    ({"gpus": "h100:8"}, "gpus", "did you mean 'gpu'"),
    ({"distributed_mode": "magic"}, "distributed_mode", "auto"),
    ({"environment": {"1BAD": "x"}}, "environment", "not valid shell names"),
    ({"num_instances": 2, "min_instances": 3}, "min_instances", "between 1 and"),
    ({"gpu": "h100:8", "workers_per_node": 3}, "workers_per_node", "does not divide"),
    ({"workers_per_node": 0}, "workers_per_node", "between 1 and 256, got 0"),
    ({"distributed_mode": "manual", "workers_per_node": 2}, "workers_per_node", "one process"),
    ({"distributed_mode": "manual", "run_on": "head"}, "run_on", "needs distributed_mode"),
    ({"priority": "urgent"}, "priority", "low"),
    ({"boot_timeout_s": 0}, "boot_timeout_s", "greater than 0"),
    ({"boot_timeout_s": 90000}, "boot_timeout_s", "less than or equal to 86400"),
    ({"availability_timeout_s": -1}, "availability_timeout_s", "greater than 0"),
])
def test_bad_options_raise_validation_error_naming_the_field(
        options: dict, field: str, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        build_task_spec(app="a", name="f", **options)
    assert field in info.value.fields
    assert fragment in str(info.value)


def test_bad_spec_at_decoration_starts_nothing(flow_home) -> None:
    app = FlowApp("bad")
    for options in ({"gpu": "h100:0"}, {"num_instances": 0}, {"gpu": "nope:1"},
                    {"max_price_per_hour": -5}, {"max_run_time_hours": -1}):
        with pytest.raises(ValidationError):
            app.function(**options)(lambda: None)
    assert not (flow_home / "tasks").exists()
    assert not (flow_home / "local" / "instances").exists()


def test_unknown_provider_is_a_validation_error() -> None:
    with pytest.raises(ValidationError) as info:
        FlowApp("x").function(provider="nimbus")(lambda: None)
    assert info.value.fields == ["provider"]
    assert "available" in str(info.value)


def test_the_two_clocks_default_to_sizes_for_real_installs() -> None:
    spec = build_task_spec(app="a", name="f")
    assert (spec.boot_timeout_s, spec.availability_timeout_s) == (1200.0, 300.0)
    spec = build_task_spec(app="a", name="f", boot_timeout_s=1800, availability_timeout_s=60)
    assert (spec.boot_timeout_s, spec.availability_timeout_s) == (1800.0, 60.0)


def test_world_size_and_slots() -> None:
    assert build_task_spec(app="a", name="f", gpu="h100:8", num_instances=4).world_size == 32
    cpu = build_task_spec(app="a", name="f", num_instances=3, workers_per_node=2)
    assert (cpu.slots_per_node, cpu.world_size) == (2, 6)
    manual = build_task_spec(app="a", name="f", gpu="h100:8", num_instances=2,
                             distributed_mode="manual")
    assert manual.slots_per_node == 1


def test_spec_round_trips_through_json() -> None:
    spec = build_task_spec(app="a", name="f", gpu="a100-80gb:4", num_instances=2,
                           environment={"A": "1"}, max_price_per_hour=40)
    from flow_sdk.spec import TaskSpec
    assert TaskSpec.model_validate(spec.model_dump(mode="json")) == spec


@pytest.mark.parametrize("path", ["relative", "/", "/usr", "/usr/local/x", "/etc/ssl", "/proc/1",
                                  "/a/../b", "/a//b", "/tmp"])
def test_mount_paths_rejected(path: str) -> None:
    with pytest.raises(ValueError):
        check_mount_path(path)


def test_mount_paths_accepted() -> None:
    assert check_mount_path("/shared/ckpt") == "/shared/ckpt"
    assert check_mount_path("/data") == "/data"


@pytest.mark.parametrize("name", ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                  "NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                                  "FLOW_NODE_RANK", "FLOW_MAIN_IP", "FLOW_RESULT_PATH"])
def test_auto_mode_refuses_environment_that_sets_a_place_in_the_gang(name: str) -> None:
    with pytest.raises(ValidationError) as info:
        build_task_spec(app="a", name="f", num_instances=2, environment={name: "99", "A": "1"})
    assert info.value.fields == ["environment"]
    message = info.value.problems[0].message
    assert f"sets {name}:" in message
    assert "drop them from environment" in message and "distributed_mode='manual'" in message


def test_auto_mode_lists_every_gang_variable_it_refuses() -> None:
    with pytest.raises(ValidationError) as info:
        build_task_spec(app="a", name="f", environment={"WORLD_SIZE": "1", "RANK": "0",
                                                        "NCCL_DEBUG": "INFO"})
    assert "sets RANK, WORLD_SIZE:" in info.value.problems[0].message


def test_manual_mode_leaves_the_rendezvous_variables_to_the_user() -> None:
    env = {"RANK": "3", "MASTER_ADDR": "10.0.0.1", "FLOW_NODE_RANK": "1"}
    spec = build_task_spec(app="a", name="f", num_instances=2, distributed_mode="manual",
                           environment=env)
    assert spec.environment == env


def test_other_variables_pass_through_in_auto_mode() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "3",
           "FLOW_MAX_RESULT_BYTES": "1000", "RANKING": "x", "MY_RANK": "y"}
    assert build_task_spec(app="a", name="f", environment=env).environment == env


@pytest.mark.parametrize("options", [
    {"stall_timeout": "10m"},  # the default collective_timeout is 10 minutes
    {"stall_timeout": "45s", "collective_timeout": "30s"},
])
def test_a_stall_timeout_the_collective_timeout_would_beat_is_refused(options: dict) -> None:
    with pytest.raises(ValidationError) as info:
        build_task_spec(app="a", name="f", **options)
    assert info.value.fields == ["stall_timeout"]
    assert "must be below collective_timeout" in str(info.value)
    assert "stall_timeout='auto'" in str(info.value)
    fits = build_task_spec(app="a", name="f", stall_timeout="20s", collective_timeout="30s")
    assert fits.stall_timeout == 20.0
