"""What a task that does not fit its pool is told, and the ids of tasks on a pool.

A task that mounts a volume its pool's nodes do not gets the command that fixes it: `flow
pool down NAME`, then the `flow pool up NAME ... --volume ...` that makes the same pool with
the volumes, which the command line reads back into the same shape. A pool task's id is the
pool's id, the function and its place in the pool's order: short, unique and readable."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest

from flow_sdk.providers import sdkwheel
from flow_sdk.cli._options import _volumes
from flow_sdk.cli.pools import pool_up_command
from flow_sdk.client.pools import POOL_APP, new_pool_id, sdk_digest
from flow_sdk.client.pooltasks import fit_problems, pool_task_id, pool_up_line
from flow_sdk.spec import GpuSpec, TaskSpec, VolumeSpec, build_task_spec, parse_duration
from flow_sdk.wire.pools import PoolRecord, pool_of_task


def _pool(**options: Any) -> tuple[PoolRecord, TaskSpec]:
    spec = build_task_spec(app=POOL_APP, name="dev", pool="dev", **options)
    assert spec.idle_stop is not None
    record = PoolRecord("dev", new_pool_id("dev"), spec.model_dump(mode="json"),
                        spec.num_instances, spec.spares, spec.idle_stop, 0.0, "up",
                        sdk_digest(), sdkwheel.python_version())
    return record, spec


def _task(**options: Any) -> TaskSpec:
    return build_task_spec(app="app", name="train", pool="dev", **options)


def _read_back(line: str) -> dict[str, Any]:
    """What `flow pool up` would make of ``line`` (parsed by the command itself)."""
    argv = shlex.split(line)
    assert argv[:3] == ["flow", "pool", "up"], line
    with pool_up_command.make_context("up", argv[3:]) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize(("pool_options", "task_volumes"), [
    ({"num_instances": 2, "idle_stop": 1800.0}, {"/shared/ckpt": {"name": "ckpt"}}),
    ({"num_instances": 3, "spares": 1, "idle_stop": "10m", "gpu": "any:2", "priority": "high",
      "max_price_per_hour": 12.5, "region": "us-west-2",
      "image": "nvcr.io/nvidia/pytorch:24.05-py3",
      "volumes": {"/shared/data": {"name": "data", "size_gb": 500},
                  "/shared/refs": {"name": "refs"}}},
     {"/shared/ckpt": {"name": "ckpt", "size_gb": 250}, "/shared/refs": {"name": "refs"},
      "/shared/data": {"name": "data", "size_gb": 800}}),  # a size the pool lacks
    ({"num_instances": 1, "idle_stop": "45s"},
     {"/shared/scratch": {"name": "scratch", "size_gb": 20, "interface": "block"}}),
])
def test_a_volume_mismatch_names_the_pool_up_that_makes_the_pool_with_it(
        pool_options: dict[str, Any], task_volumes: dict[str, Any]) -> None:
    record, pool = _pool(**pool_options)
    task = _task(num_instances=record.size, gpu=pool.gpu.model_dump() if pool.gpu else None,
                 image=pool.image, volumes=task_volumes)
    [problem] = fit_problems(record, task, [])
    assert problem.field == "volumes"
    found = re.search(r"`flow pool down dev` then `(flow pool up [^`]+)`", problem.message)
    assert found is not None, problem.message
    assert "or drop them from the task" in problem.message
    params = _read_back(found[1])
    assert params["name"] == "dev"
    assert (params["num_instances"], params["spares"]) == (record.size, record.spares)
    assert parse_duration(params["idle_stop"], "idle_stop") == record.idle_stop_s
    assert (GpuSpec.parse(params["gpu"]) if params["gpu"] else None) == pool.gpu
    assert (params["image"], params["region"], params["max_price_per_hour"]) == (
        pool.image, pool.region, pool.max_price_per_hour)
    assert (params["priority"] or "med", params["provider"]) == (pool.priority, pool.provider)
    wanted = {**pool.volumes, **task.volumes}
    assert {p: VolumeSpec(**v) for p, v in _volumes(params["volume"]).items()} == wanted


def test_the_line_leaves_defaults_out() -> None:
    record, pool = _pool(num_instances=2, idle_stop=1800.0)
    line = pool_up_line(record, pool, {"/shared/ckpt": VolumeSpec(name="ckpt")})
    assert line == "flow pool up dev -N 2 --volume /shared/ckpt=ckpt"


def test_a_task_whose_volumes_the_pool_mounts_fits() -> None:
    record, pool = _pool(num_instances=2, idle_stop=1800.0,
                         volumes={"/shared/ckpt": "ckpt", "/shared/data": "data"})
    assert fit_problems(record, _task(num_instances=2, volumes={"/shared/ckpt": "ckpt"}),
                        []) == []


def test_a_pool_task_id_is_short_unique_and_says_which_task() -> None:
    pool_id = new_pool_id("dev")
    ids = [pool_task_id(pool_id, "train", n) for n in range(3)]
    assert len(set(ids)) == 3
    assert ids[0] == f"{pool_id}.train-0"
    assert re.fullmatch(r"dev-\d{8}-\d{6}-[0-9a-f]{6}\.train-0", ids[0])
    assert len(ids[0]) <= 40
    assert all(pool_of_task(i) == pool_id for i in ids)
    # a long or odd name is cut to a short slug; a name with no letter or digit reads "task"
    assert pool_task_id(pool_id, "My Very Long Training Function", 12) == \
        f"{pool_id}.my-very-long-12"
    assert pool_task_id(pool_id, "__", 3) == f"{pool_id}.task-3"
    assert len(pool_task_id(pool_id, "x" * 200, 99_999)) <= 45
