"""GPU allocation on one machine: the plain rule over machines of 1, 4 and 8 GPUs, the holder
registry under concurrent reservations, and its wiring into the local provider (with an
``nvidia-smi`` on PATH that reports the GPUs of the machine being modelled)."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flow_sdk import FlowApp, Task, TaskStatus
from flow_sdk.errors import ProviderError, ValidationError
from flow_sdk.providers.local import _gpus as lg
from flow_sdk.providers.local._gpus import GpuRegistry, GpusBusyError, GpuShortageError, LocalGpu

H100 = "NVIDIA H100 80GB HBM3"
L40S = "NVIDIA L40S"


def machine(count: int, name: str = H100) -> list[LocalGpu]:
    return [LocalGpu(i, name) for i in range(count)]


def never_live(task_id: str) -> bool:
    return False


def always_live(task_id: str) -> bool:
    return True


# -- the plain rule ------------------------------------------------------------------------

@pytest.mark.parametrize(("gpus", "count", "nodes", "expected"), [
    (1, 1, 1, [(0,)]),
    (4, 1, 4, [(0,), (1,), (2,), (3,)]),
    (4, 2, 2, [(0, 1), (2, 3)]),
    (8, 4, 2, [(0, 1, 2, 3), (4, 5, 6, 7)]),
    (8, 8, 1, [tuple(range(8))]),
    (8, 1, 3, [(0,), (1,), (2,)]),
])
def test_slices_are_disjoint_and_take_the_lowest_free_indexes(
        gpus: int, count: int, nodes: int, expected: list[tuple[int, ...]]) -> None:
    slices = lg.allocate(machine(gpus), count, "h100", nodes, {})
    assert slices == expected
    flat = [i for part in slices for i in part]
    assert len(flat) == len(set(flat)) == count * nodes


def test_held_gpus_are_skipped_on_an_8_gpu_machine() -> None:
    held = {0: "task-a", 1: "task-a", 5: "task-b"}
    assert lg.allocate(machine(8), 2, "any", 2, held) == [(2, 3), (4, 6)]


@pytest.mark.parametrize(("gpus", "count", "nodes"), [(1, 2, 1), (4, 1, 5), (8, 4, 3)])
def test_more_than_the_machine_has_names_what_it_has(gpus: int, count: int, nodes: int) -> None:
    with pytest.raises(GpuShortageError) as info:
        lg.allocate(machine(gpus), count, "h100", nodes, {})
    assert f"{gpus} x {H100}" in str(info.value)
    assert f"need {count * nodes}" in str(info.value)


def test_wrong_model_names_the_machines_model() -> None:
    with pytest.raises(GpuShortageError) as info:
        lg.allocate(machine(4), 1, "a100", 1, {})
    assert "a100" in str(info.value) and H100 in str(info.value)
    assert "any:1" in str(info.value)


def test_a_machine_without_gpus_says_so() -> None:
    with pytest.raises(GpuShortageError, match="no NVIDIA GPU"):
        lg.allocate([], 1, "any", 1, {})


def test_busy_gpus_name_every_holder() -> None:
    with pytest.raises(GpusBusyError) as info:
        lg.allocate(machine(4), 2, "h100", 1, {0: "task-a", 1: "task-a", 2: "task-b"})
    assert info.value.holders == {0: "task-a", 1: "task-a", 2: "task-b"}
    assert "GPU 0, 1 held by task task-a" in str(info.value)
    assert "GPU 2 held by task task-b" in str(info.value)


def test_mixed_machine_matches_models_by_word() -> None:
    mixed = [LocalGpu(0, L40S), LocalGpu(1, "NVIDIA L4"), LocalGpu(2, "NVIDIA L4")]
    assert lg.allocate(mixed, 2, "l4", 1, {}) == [(1, 2)]
    assert lg.allocate(mixed, 1, "l40s", 1, {}) == [(0,)]
    assert lg.allocate(mixed, 3, "any", 1, {}) == [(0, 1, 2)]


def test_nvidia_smi_output_is_parsed() -> None:
    text = f"1, {H100}\n0, {H100}\n\nNo devices were found\n"
    assert lg.parse_gpu_list(text) == machine(2)
    assert lg.visible_devices((2, 3)) == "2,3" and lg.visible_devices(()) == ""


# -- the registry --------------------------------------------------------------------------

def test_concurrent_reservations_never_share_a_gpu(tmp_path: Path) -> None:
    registry = GpuRegistry(tmp_path / "gpus")
    got: dict[str, object] = {}

    def reserve(task: str) -> None:
        got[task] = registry.try_reserve(task, machine(8), 1, "h100", 1, always_live)

    threads = [threading.Thread(target=reserve, args=(f"t{i}",)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    slices = [v for v in got.values() if isinstance(v, list)]
    busy = [v for v in got.values() if isinstance(v, GpusBusyError)]
    assert len(slices) == 8 and len(busy) == 2
    assert sorted(part[0][0] for part in slices) == list(range(8))
    assert sorted(registry.holders()) == list(range(8))


def test_release_and_dead_holders_free_gpus(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    registry = GpuRegistry(tmp_path / "gpus")
    assert registry.try_reserve("a", machine(1), 1, "any", 1, always_live) == [(0,)]
    assert isinstance(registry.try_reserve("b", machine(1), 1, "any", 1, always_live),
                      GpusBusyError)
    registry.release("a")
    assert registry.try_reserve("b", machine(1), 1, "any", 1, always_live) == [(0,)]
    # b has no live node, but reserved just now: its nodes may still be starting
    assert isinstance(registry.try_reserve("c", machine(1), 1, "any", 1, never_live),
                      GpusBusyError)
    # past the launch grace, a holder without a live node is dropped: c takes the GPU
    monkeypatch.setattr(lg, "LAUNCH_GRACE_S", 0.0)
    assert registry.try_reserve("c", machine(1), 1, "any", 1, never_live) == [(0,)]
    assert registry.holders() == {0: "c"}


def test_reserve_waits_then_names_the_holder(tmp_path: Path) -> None:
    registry = GpuRegistry(tmp_path / "gpus")
    registry.try_reserve("holder", machine(1), 1, "any", 1, always_live)
    heard: list[str] = []
    with pytest.raises(GpusBusyError) as info:
        registry.reserve("late", machine(1), 1, "any", 1, always_live, 0.6, heard.append)
    assert "held by task holder" in str(info.value) and "availability_timeout_s" in str(info.value)
    assert len(heard) == 1 and "waiting up to 0.6 s" in heard[0]


def test_reserve_gets_the_gpu_once_the_holder_releases_it(tmp_path: Path) -> None:
    registry = GpuRegistry(tmp_path / "gpus")
    registry.try_reserve("holder", machine(1), 1, "any", 1, always_live)
    timer = threading.Timer(0.3, registry.release, args=("holder",))
    timer.start()
    try:
        assert registry.reserve("late", machine(1), 1, "any", 1, always_live, 30.0,
                                lambda message: None) == [(0,)]
    finally:
        timer.join()


# -- wired into the local provider ---------------------------------------------------------

@pytest.fixture
def four_h100s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This machine as the local provider sees it: four H100s, per its nvidia-smi."""
    folder = tmp_path / "bin"
    folder.mkdir()
    exe = folder / "nvidia-smi"
    lines = "\\n".join(f"{i}, {H100}" for i in range(4))
    exe.write_text(f"#!/bin/sh\nprintf '{lines}\\n'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    yield folder


app = FlowApp("gpus", provider_config={"ssh": False})


def visible() -> dict[str, str]:
    return {k: os.environ.get(k, "<unset>")
            for k in ("CUDA_VISIBLE_DEVICES", "RANK", "OMP_NUM_THREADS")}


@pytest.mark.slow
def test_gpu_task_nodes_get_disjoint_slices_and_cpu_nodes_none(four_h100s: Path) -> None:
    gpu_task = app.function(gpu="h100:2", num_instances=2)(visible).spawn()
    cpu_task = app.function(num_instances=2, workers_per_node=2)(visible).spawn()
    gpu_results = gpu_task.results(timeout=120)
    cpu_results = cpu_task.results(timeout=120)
    assert gpu_task.status is TaskStatus.SUCCEEDED
    per_rank = [r["CUDA_VISIBLE_DEVICES"] for r in gpu_results]
    # both workers of a node see its slice; the two nodes' slices are disjoint
    assert per_rank[0] == per_rank[1] and per_rank[2] == per_rank[3]
    assert sorted([per_rank[0], per_rank[2]]) == ["0,1", "2,3"]
    assert [r["CUDA_VISIBLE_DEVICES"] for r in cpu_results] == [""] * 4
    # 4 worker slots of the task share this machine's cores
    share = str(max(1, len(os.sched_getaffinity(0)) // 4))
    assert [r["OMP_NUM_THREADS"] for r in cpu_results] == [share] * 4


@pytest.mark.slow
def test_second_gpu_task_waits_then_fails_naming_the_holder(four_h100s: Path,
                                                            flow_home: Path) -> None:
    hold = app.function(gpu="h100:4")(_sleep)
    holder = hold.spawn(60.0)
    try:
        late = app.function(gpu="any:1", availability_timeout_s=1.0)(visible)
        with pytest.raises(ProviderError, match=f"held by task {holder.task_id}"):
            late.spawn()
    finally:
        holder.cancel()
    # the late task said in its boot log what it waited for, and ended FAILED
    (late_id,) = [p.stem for p in (flow_home / "tasks").glob("*.json")
                  if p.stem != holder.task_id]
    late_task = Task.from_id(late_id)
    assert late_task.status is TaskStatus.FAILED
    assert any(f"held by task {holder.task_id}" in line and "waiting up to 1 s" in line
               for line in late_task.logs(source="boot"))
    # cancelled: its GPUs are free again
    assert app.function(gpu="any:4")(visible).remote()["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def _sleep(seconds: float) -> None:
    import time

    time.sleep(seconds)


def test_check_names_what_the_machine_has(four_h100s: Path) -> None:
    with pytest.raises(ValidationError) as info:
        app.function(gpu="a100:1")(visible).spawn()
    assert info.value.fields == ["gpu"]
    assert f"4 x {H100}" in str(info.value)
