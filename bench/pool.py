"""Warm pools against cold tasks and torchrun, side by side in one run.

    python bench/pool.py [--repeats 5] [--sim-repeats 3] [--spare-runs 1] [--skip-sim]

1. Local provider, 2 nodes x 2 workers, gloo all-reduce, ``.spawn()`` -> ``.result()``: a cold
   task (its own nodes, started and torn down), a warm task (on a pool that is up), and two
   ``torchrun --rdzv-backend=static`` processes on loopback, from start until both exit.
   Rounds alternate the three. Targets: warm <= 0.30x cold, warm <= 0.35x torchrun.
2. Code bytes: what a second task on the pool with unchanged code stores under the pool's
   payload folder, code and arguments apart. Target: 0 code bytes.
3. Simulated cloud (``aws-sim``, default settings), 2 nodes: cold against warm. Target: warm
   at least 10x faster.
4. Hot spare on the simulated cloud: a seeded 3-node DDP run (max_restarts=1, a checkpoint
   per step on a shared folder) whose node 1 agent is killed mid-training, on a pool with
   spares=1 against the same cold task. Recovery = the first step after the kill minus the
   moment the failure was detected (the restart decision's report): same detection settings
   in both. Target: pool <= 0.30x cold, and both end with the weights of an uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _allreduce import allreduce_job  # noqa: E402
from launch import time_torchrun  # noqa: E402

from flow_sdk import FlowApp, FlowError, Task, wire  # noqa: E402
from flow_sdk.system import procs
from flow_sdk.client.pools import Pool, pool_up  # noqa: E402

SETTLE_S = 5.0  # between simulated rounds: what the last one tore down stops first


def _timed(task_of: Any) -> float:
    start = time.perf_counter()
    result = task_of().result(timeout=600)
    elapsed = time.perf_counter() - start
    assert result == 10.0 or isinstance(result, float), result
    return elapsed


def local_rounds(repeats: int) -> dict[str, list[float]]:
    app = FlowApp("bench-pool")
    cold = app.function(num_instances=2, workers_per_node=2, quiet=True)(allreduce_job)
    warm = app.function(num_instances=2, workers_per_node=2, pool="bench",
                        quiet=True)(allreduce_job)
    pool = pool_up("bench", num_instances=2, idle_stop="30m")
    try:
        _timed(cold.spawn)  # the page cache, for every side
        _timed(warm.spawn)
        time_torchrun()
        times: dict[str, list[float]] = {"cold": [], "warm": [], "torchrun": []}
        for _ in range(repeats):
            times["cold"].append(_timed(cold.spawn))
            times["warm"].append(_timed(warm.spawn))
            times["torchrun"].append(time_torchrun())
        code_bytes(pool, app)
    finally:
        pool.down()
    return times


def allreduce_scaled(scale: float) -> float:
    """The all-reduce times ``scale``: a call whose arguments change from task to task."""
    return allreduce_job() * scale


def code_bytes(pool: Pool, app: FlowApp) -> None:
    """Bytes stored under the pool's payload folder by a second task whose code is unchanged
    and whose arguments are new."""
    fn = app.function(num_instances=2, workers_per_node=2, pool="bench",
                      quiet=True)(allreduce_scaled)
    fn.spawn(1.0).result(timeout=300)
    store = pool.provider.store
    folder = f"tasks/{pool.pool_id}/payloads/"
    before = set(store.list(folder))
    task: Task = fn.spawn(2.0)
    task.result(timeout=300)
    record = task.record()
    added = set(store.list(folder)) - before
    sizes = {k: len(store.get(k) or b"") for k in added}
    code = sum(v for k, v in sizes.items() if k.endswith(record.code_digest))
    args = sum(v for k, v in sizes.items() if k.endswith(record.payload_digest))
    print(f"code bytes stored for a task with unchanged code: {code} (target 0); "
          f"arguments: {args} bytes")


def sim_rounds(repeats: int) -> dict[str, list[float]]:
    app = FlowApp("bench-pool-sim", provider="aws-sim")
    cold = app.function(num_instances=2, quiet=True)(allreduce_job)
    warm = app.function(num_instances=2, pool="bench-sim", quiet=True)(allreduce_job)
    pool = pool_up("bench-sim", provider="aws-sim", num_instances=2, idle_stop="30m")
    try:
        times: dict[str, list[float]] = {"cold": [], "warm": []}
        for _ in range(repeats):
            times["cold"].append(_timed(cold.spawn))
            time.sleep(SETTLE_S)  # the cold task's instances power off before the next round
            times["warm"].append(_timed(warm.spawn))
            time.sleep(SETTLE_S)
    finally:
        pool.down()
    return times


def _train(steps: int, folder: str) -> list[float]:
    """Seeded DDP on 3 nodes, a checkpoint per step in ``folder``, resumed from it."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    ckpt = Path(folder) / "ckpt.pt"
    start = 0
    if ckpt.exists():
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        start = saved["step"]
    for step in range(start, steps):
        x = torch.randn(32, 16, generator=torch.Generator().manual_seed(step * 100 + rank))
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "step": step + 1}, ckpt.with_suffix(".tmp"))
            os.replace(ckpt.with_suffix(".tmp"), ckpt)
            print(f"step {step + 1}", flush=True)
        dist.barrier()
        time.sleep(0.25)
    weights = [float(v) for v in torch.cat([p.detach().flatten() for p in model.parameters()])]
    dist.destroy_process_group()
    return weights


def _step_times(task: Task) -> list[tuple[float, int]]:
    return [(e["ts"], int(e["text"].split()[1])) for e in task.log_entries(node=0)
            if e["text"].startswith("step ")]


def _sim_agent_pid(task: Task, instance_id: str) -> int:
    """The pid of a cold simulated node's agent (``python -m flow_sdk.node.agent``)."""
    for pid in procs.pids_with_env("FLOW_SIM_INSTANCE", [f"{task.task_id}/{instance_id}"]):
        try:
            if b"flow_sdk.node.agent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    raise RuntimeError(f"no agent process for {instance_id}")


def recovery(task: Task, kill: Any, kill_after_step: int) -> float:
    """Seconds from the detected failure to the first step after the kill."""
    while not any(s >= kill_after_step for _, s in _step_times(task)):
        time.sleep(0.1)
    gang = {n.node: n.instance_id for n in task.nodes()}
    killed_at = time.time()
    kill(gang[1])
    task.result(timeout=900)
    raw = task.store.get_record(wire.restart_key(task.task_id, 1))
    members = task.store.get_record(wire.membership_key(task.task_id, 1))
    assert raw is not None and members is not None, "no restart was decided"
    detected = float(json.loads(raw)["reason"]["observed_at"])
    regenerated = wire.MembershipRecord.from_json(members).written_at  # generation 0 stops
    resumed = min(ts for ts, _ in _step_times(task) if ts > regenerated)
    print(f"  {task.task_id}: detected {detected - killed_at:.1f}s after the kill, resumed "
          f"{resumed - killed_at:.1f}s after it")
    return resumed - detected


def spare_rounds(runs: int) -> dict[str, Any]:
    app = FlowApp("bench-spare", provider="aws-sim")
    folder = Path(tempfile.mkdtemp(prefix="flow-spare-"))
    options = {"num_instances": 3, "max_restarts": 1, "quiet": True}
    cold = app.function(**options)(_train)
    warm = app.function(pool="bench-spare", **options)(_train)
    pool = pool_up("bench-spare", provider="aws-sim", num_instances=3, spares=1,
                   idle_stop="30m")
    out: dict[str, Any] = {"cold": [], "pool": [], "weights_diff": [], "failed": []}
    try:
        steps = 24
        (folder / "reference").mkdir()  # uninterrupted, on the pool's nodes
        reference = warm.spawn(steps, str(folder / "reference")).result(timeout=900)
        for run in range(runs):
            for side, fn in (("cold", cold), ("pool", warm)):
                ckpt = folder / f"{side}-{run}"
                ckpt.mkdir()
                task = fn.spawn(steps, str(ckpt))
                if side == "cold":
                    def kill(instance_id: str, task: Task = task) -> None:
                        os.kill(_sim_agent_pid(task, instance_id), signal.SIGKILL)
                else:
                    def kill(instance_id: str) -> None:
                        os.kill(pool.members()[instance_id].agent_pid, signal.SIGKILL)
                try:
                    out[side].append(recovery(task, kill, 6))
                except FlowError as exc:  # reported, and the other runs go on
                    out["failed"].append(f"{side} run {run}: {exc}")
                    continue
                weights = task.result(timeout=60)
                out["weights_diff"].append(max(abs(a - b) for a, b in zip(weights, reference)))
    finally:
        pool.down()
    return out


def _row(name: str, values: list[float]) -> str:
    return (f"{name:<40}{statistics.median(values):>10.2f}{min(values):>9.2f}"
            f"{max(values):>9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sim-repeats", type=int, default=3)
    parser.add_argument("--spare-runs", type=int, default=1)
    parser.add_argument("--skip-sim", action="store_true")
    parser.add_argument("--only", choices=["local", "sim", "spare"],
                        help="one part only (the figures of record run them all)")
    args = parser.parse_args()
    os.environ.setdefault("FLOW_HOME", tempfile.mkdtemp(prefix="flow-bench-"))
    if args.only in (None, "local"):
        report_local(local_rounds(args.repeats))
    if args.skip_sim or args.only == "local":
        return
    try:
        if args.only in (None, "sim"):
            report_sim(sim_rounds(args.sim_repeats))
        if args.only in (None, "spare"):
            report_spare(spare_rounds(args.spare_runs))
    finally:
        stopped = FlowApp("bench-pool-sim", provider="aws-sim").provider().stop_server()
        print(f"stopped the simulated account (server pid {stopped})")


def report_local(local: dict[str, list[float]]) -> None:
    print(f"{'local, 2 nodes x 2 workers':<40}{'median s':>10}{'min s':>9}{'max s':>9}")
    print(_row("cold task (.spawn->.result)", local["cold"]))
    print(_row("warm task on a pool", local["warm"]))
    print(_row("torchrun x2, static rdzv", local["torchrun"]))
    warm = statistics.median(local["warm"])
    print(f"warm/cold {warm / statistics.median(local['cold']):.2f} (target <= 0.30); "
          f"warm/torchrun {warm / statistics.median(local['torchrun']):.2f} (target <= 0.35)")


def report_sim(sim: dict[str, list[float]]) -> None:
    print(f"{'aws-sim, 2 nodes, default settings':<40}{'median s':>10}{'min s':>9}{'max s':>9}")
    print(_row("cold task", sim["cold"]))
    print(_row("warm task on a pool", sim["warm"]))
    print(f"cold/warm {statistics.median(sim['cold']) / statistics.median(sim['warm']):.1f}x "
          "(target >= 10x)")


def report_spare(spare: dict[str, Any]) -> None:
    for failure in spare["failed"]:
        print(f"FAILED {failure.splitlines()[0]}")
    if not spare["cold"] or not spare["pool"]:
        return
    print(f"{'aws-sim, 3 nodes, node 1 agent killed':<40}{'median s':>10}{'min s':>9}"
          f"{'max s':>9}")
    print(_row("recovery without a spare (cold)", spare["cold"]))
    print(_row("recovery on a pool with spares=1", spare["pool"]))
    print(f"pool/cold {statistics.median(spare['pool']) / statistics.median(spare['cold']):.2f}"
          f" (target <= 0.30); final weights against an uninterrupted run: largest "
          f"difference {max(spare['weights_diff']):.1e} (equal within 1e-6: "
          f"{max(spare['weights_diff']) <= 1e-6})")


if __name__ == "__main__":
    main()
