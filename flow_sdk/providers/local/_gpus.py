"""Which of this machine's GPUs each local node gets, and who holds which (stdlib only).

Local nodes share one machine, so its GPUs are handed out here:

* :func:`detect_gpus` lists the machine's GPUs with ``nvidia-smi`` (none without a driver);
  the client never imports torch for it.
* :func:`allocate` is the plain allocation rule: given the machine's GPUs, one task's per-node
  request (count and model, or any model), its node count and the GPUs other running tasks
  hold, it returns one disjoint slice of GPU indexes per node, or raises a typed error that
  names what the machine has (:class:`GpuShortageError`, which waiting cannot fix) or who holds
  what (:class:`GpusBusyError`).
* :class:`GpuRegistry` keeps the holders in a JSON file under the provider's root, changed
  only under an exclusive file lock, so two tasks started at once never get the same GPU.
  A holder whose task has no live node any more is dropped when the file is next read
  (unless it reserved less than ``LAUNCH_GRACE_S`` ago: its nodes may still be starting).
"""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flow_sdk.errors import ProviderError

ANY_MODEL = "any"
NVIDIA_SMI_TIMEOUT_S = 30.0
WAIT_POLL_S = 0.5
LAUNCH_GRACE_S = 120.0  # a reservation this young is kept: its task is still starting nodes


@dataclass(frozen=True)
class LocalGpu:
    """One GPU of this machine: its index (as ``CUDA_VISIBLE_DEVICES`` counts) and name."""

    index: int
    name: str  # as nvidia-smi reports it, e.g. "NVIDIA H100 80GB HBM3"


class GpuShortageError(ProviderError):
    """The machine does not have the GPUs a task asks for, whoever holds them."""


class GpusBusyError(ProviderError):
    """The machine has the GPUs, but other running tasks hold too many of them."""

    def __init__(self, message: str, holders: Mapping[int, str]) -> None:
        super().__init__(message)
        self.holders = dict(holders)  # GPU index -> task id holding it


def parse_gpu_list(text: str) -> list[LocalGpu]:
    """GPUs from ``nvidia-smi --query-gpu=index,name --format=csv,noheader`` output."""
    gpus = []
    for line in text.splitlines():
        index, sep, name = line.partition(",")
        if sep and index.strip().isdigit():
            gpus.append(LocalGpu(int(index.strip()), name.strip()))
    return sorted(gpus, key=lambda gpu: gpu.index)


def detect_gpus() -> list[LocalGpu]:
    """This machine's NVIDIA GPUs per ``nvidia-smi`` (none when it is absent or fails)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    proc = subprocess.run([exe, "--query-gpu=index,name", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S,
                          check=False)
    return parse_gpu_list(proc.stdout) if proc.returncode == 0 else []


def model_matches(model: str, gpu_name: str) -> bool:
    """Whether a GPU named ``gpu_name`` is of the catalog ``model`` (``any`` matches all).

    Names are compared by word: ``h100`` matches "NVIDIA H100 80GB HBM3", ``l4`` matches
    "NVIDIA L4" but not "NVIDIA L40S"."""
    if model == ANY_MODEL:
        return True
    return model.lower() in re.split(r"[^a-z0-9]+", gpu_name.lower())


def describe_machine(machine: Sequence[LocalGpu]) -> str:
    """What the machine has, for error messages: ``"2 x NVIDIA H100 80GB HBM3 (0, 1)"``."""
    if not machine:
        return "no NVIDIA GPU (nvidia-smi is absent or lists none)"
    names: dict[str, list[int]] = {}
    for gpu in machine:
        names.setdefault(gpu.name, []).append(gpu.index)
    return "; ".join(f"{len(idx)} x {name} ({', '.join(map(str, idx))})"
                     for name, idx in names.items())


def shortage(machine: Sequence[LocalGpu], count: int, model: str, nodes: int) -> str | None:
    """Why the machine can never serve ``nodes`` x ``count`` GPUs of ``model``; None if it can."""
    matching = [gpu for gpu in machine if model_matches(model, gpu.name)]
    needed = count * nodes
    if len(matching) >= needed:
        return None
    what = "GPU(s)" if model == ANY_MODEL else f"{model} GPU(s)"
    return (f"{nodes} local node(s) x {count} {what} need {needed}, but this machine has "
            f"{describe_machine(machine)}; lower the count or num_instances, ask for "
            f"gpu='any:{count}' to take whatever model is here, or use a cloud provider")


def _free_slices(machine: Sequence[LocalGpu], count: int, model: str, nodes: int,
                 held: Mapping[int, str]) -> list[tuple[int, ...]] | None:
    free = [gpu.index for gpu in machine
            if model_matches(model, gpu.name) and gpu.index not in held]
    if len(free) < count * nodes:
        return None
    return [tuple(free[n * count:(n + 1) * count]) for n in range(nodes)]


def _busy_error(machine: Sequence[LocalGpu], count: int, model: str, nodes: int,
                held: Mapping[int, str]) -> GpusBusyError:
    busy = {i: t for i, t in held.items()
            if any(g.index == i and model_matches(model, g.name) for g in machine)}
    free = sum(1 for g in machine if model_matches(model, g.name)) - len(busy)
    return GpusBusyError(f"{count * nodes} GPU(s) needed but only {free} free: "
                         f"{describe_holders(busy)}", busy)


def machine_problem(count: int, model: str, nodes: int, unsold: str | None) -> str | None:
    """Why this machine can never serve the request; None if it can. ``unsold`` says why no
    machine sold anywhere holds ``count`` GPUs of ``model`` (the catalog's judgement): it
    stands unless this very machine has them. A machine with no GPU at all serves every other
    request: each requested GPU is one CPU worker, so GPU code can be tried on a laptop in the
    shape a cloud would run it."""
    machine = detect_gpus()
    if not machine:
        return unsold
    short = shortage(machine, count, model, nodes)
    return None if short is None else unsold or short


def allocate(machine: Sequence[LocalGpu], count: int, model: str, nodes: int,
             held: Mapping[int, str]) -> list[tuple[int, ...]]:
    """One disjoint slice of ``count`` GPU indexes per node, from GPUs nobody ``held``.

    ``model`` is a catalog model name or ``"any"``; ``held`` maps GPU index -> holding task.
    Slices take the lowest free indexes, in order. Raises :class:`GpuShortageError` when the
    machine lacks the GPUs, :class:`GpusBusyError` when others hold too many of them."""
    problem = shortage(machine, count, model, nodes)
    if problem is not None:
        raise GpuShortageError(problem)
    slices = _free_slices(machine, count, model, nodes, held)
    if slices is None:
        raise _busy_error(machine, count, model, nodes, held)
    return slices


def describe_holders(held: Mapping[int, str]) -> str:
    """``"GPU 0, 1 held by task a; GPU 2 held by task b"``."""
    by_task: dict[str, list[int]] = {}
    for index, task in sorted(held.items()):
        by_task.setdefault(task, []).append(index)
    return "; ".join(f"GPU {', '.join(map(str, idx))} held by task {task}"
                     for task, idx in by_task.items())


def visible_devices(indexes: Sequence[int]) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value of a slice (``""``: no GPU at all)."""
    return ",".join(str(i) for i in indexes)


class GpuRegistry:
    """Which task holds which GPU of this machine, in ``<folder>/holders.json``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / "holders.json"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "holders.lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _read(self) -> dict[int, tuple[str, float]]:
        """GPU index -> (task id, when it was reserved)."""
        if not self.path.exists():
            return {}
        return {int(i): (str(task), float(at))
                for i, (task, at) in json.loads(self.path.read_text()).items()}

    def _write(self, held: Mapping[int, tuple[str, float]]) -> None:
        temp = self.path.with_suffix(".tmp")
        temp.write_text(json.dumps({str(i): list(entry) for i, entry in sorted(held.items())}))
        temp.replace(self.path)

    def holders(self) -> dict[int, str]:
        """GPU index -> task id, as last written."""
        with self._locked():
            return {i: task for i, (task, _) in self._read().items()}

    def try_reserve(self, task_id: str, machine: Sequence[LocalGpu], count: int, model: str,
                    nodes: int, is_live: Callable[[str], bool]
                    ) -> list[tuple[int, ...]] | GpusBusyError:
        """Reserve one slice per node for ``task_id`` now; else the :class:`GpusBusyError`
        naming the holders (returned, not raised). Holders whose task is not ``is_live``
        are dropped first. Raises :class:`GpuShortageError` when waiting cannot help."""
        problem = shortage(machine, count, model, nodes)
        if problem is not None:
            raise GpuShortageError(problem)
        now = time.time()
        with self._locked():
            kept = {i: (task, at) for i, (task, at) in self._read().items()
                    if task != task_id and (now - at < LAUNCH_GRACE_S or is_live(task))}
            held = {i: task for i, (task, _) in kept.items()}
            slices = _free_slices(machine, count, model, nodes, held)
            if slices is None:
                return _busy_error(machine, count, model, nodes, held)
            kept.update({i: (task_id, now) for part in slices for i in part})
            self._write(kept)
            return slices

    def reserve(self, task_id: str, machine: Sequence[LocalGpu], count: int, model: str,
                nodes: int, is_live: Callable[[str], bool], timeout_s: float,
                on_wait: Callable[[str], None]) -> list[tuple[int, ...]]:
        """Like :meth:`try_reserve`, waiting up to ``timeout_s`` while other tasks hold the
        GPUs; ``on_wait`` hears once what it waits for. When the time is up, raises
        :class:`GpusBusyError` naming the holders."""
        deadline = time.monotonic() + timeout_s
        told = False
        while True:
            outcome = self.try_reserve(task_id, machine, count, model, nodes, is_live)
            if not isinstance(outcome, GpusBusyError):
                return outcome
            if time.monotonic() >= deadline:
                raise GpusBusyError(f"gave up after waiting {timeout_s:g} s "
                                    f"(availability_timeout_s) for this machine's GPUs: "
                                    f"{outcome}; wait for those tasks to end or cancel them",
                                    outcome.holders)
            if not told:
                on_wait(f"waiting up to {timeout_s:g} s for GPUs: {outcome}")
                told = True
            time.sleep(WAIT_POLL_S)

    def reserve_here(self, task_id: str, count: int, model: str, nodes: int,
                     is_live: Callable[[str], bool], timeout_s: float,
                     on_wait: Callable[[str], None]) -> list[tuple[int, ...]]:
        """:meth:`reserve` on this machine's GPUs; no slices on a machine without GPUs."""
        machine = detect_gpus()
        if not machine:
            return []
        return self.reserve(task_id, machine, count, model, nodes, is_live, timeout_s, on_wait)

    def release(self, task_id: str) -> None:
        """Drop every GPU ``task_id`` holds."""
        with self._locked():
            held = self._read()
            kept = {i: entry for i, entry in held.items() if entry[0] != task_id}
            if kept != held:
                self._write(kept)
