"""Judge a running chaos scenario: its terminal state and when it came, ``flow gc`` after a
killed caller (as a user would run it), its results against the fault-free computation, and
its logs up to the fault."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _chaos_draw import Scenario
from _chaos_inject import Stage
from _chaos_job import SIM_LEASE_TTL_S, compute
from _chaos_tasks import TaskFinder, direct_provider, handle

if TYPE_CHECKING:
    from _chaos_run import Bench, Result

GC_SETTLE_S = 15.0  # after `flow gc`, the task's state is read for this long at most
# a line printed this long before the fault is shipped
LOG_SHIP_S = {"local": 1.0, "aws-sim": 3.0, "slurm": 1.0}


def _client_config(home: Path, task_id: str, fallback: dict[str, Any]) -> dict[str, Any]:
    path = home / "tasks" / f"{task_id}.json"
    try:
        return dict(json.loads(path.read_text())["provider_config"])
    except (OSError, ValueError, KeyError):
        return fallback


def _wait_terminal(bench: Bench, sc: Scenario, home: Path, task_id: str,
                   deadline: float) -> tuple[str | None, float]:
    """The task's terminal status read from the store (None: no record), and when seen."""
    from flow_sdk.errors import TaskNotFoundError

    plan = json.loads((home / "plan.json").read_text())
    config = _client_config(home, task_id, plan["provider_config"])
    task = handle(task_id, direct_provider(sc.provider, config, bench.account))
    while True:
        try:
            status = task.status
        except TaskNotFoundError:
            return None, time.time()
        if status.is_terminal:
            return str(status.value), time.time()
        if time.monotonic() >= deadline:
            return "HUNG", time.time()
        time.sleep(0.2)


def run_gc(bench: Bench, sc: Scenario, home: Path) -> str:
    """``flow gc`` once, as the user of a killed caller would."""
    if bench.proxy is not None:
        bench.proxy.book.disarm()  # the faults were the scenario's; gc is the user's recovery
    argv = [sys.executable, "-c", "from flow_sdk.cli import main; main()", "gc"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    return f"flow gc exited {done.returncode}: {(done.stdout + done.stderr).strip()[-300:]}"


def _caller_end(caller: subprocess.Popen[bytes], deadline: float) -> bool:
    while caller.poll() is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def judge(bench: Bench, sc: Scenario, stage: Stage, caller: subprocess.Popen[bytes],
          finder: TaskFinder, started: float) -> Result:
    from _chaos_run import Result, bound_of, events

    bound = bound_of(sc)
    deadline = started + bound
    result = Result(sc.seed, sc.provider, sc.kinds, [f.phase for f in sc.faults],
                    sc.describe(), "HUNG", 0.0, round(bound, 1), 0)
    exited = _caller_end(caller, deadline)
    killed = bool({"caller-sigkill", "time-limit"} & set(sc.kinds)) and bool(
        stage.struck_at) and caller.returncode == -9
    if killed:  # as its user would: wait for the nodes to be done, then `flow gc` once
        _settle_orphan(bench, sc, stage, finder, deadline)
        result.notes.append(run_gc(bench, sc, stage.home))
        deadline = min(deadline, time.monotonic() + GC_SETTLE_S)  # what gc left is final
    end_wall = time.time()
    seen = events(stage.home)
    statuses = []
    for task_id in finder.task_ids():
        status, at = _wait_terminal(bench, sc, stage.home, task_id, deadline)
        if status is not None:
            statuses.append(status if status != "HUNG" or not killed else "NO-OUTCOME")
            end_wall = max(end_wall, at) if exited else at
    result.struck = len(stage.struck_at)
    first = min(stage.struck_at) if stage.struck_at else started_wall(started)
    result.terminal_s = round(end_wall - first, 2)
    result.status = _status(exited or bool(killed), statuses, seen)
    if result.status == "SUCCEEDED":
        result.lost += _check_results(sc, seen, finder, bench, stage.home)
    result.lost += _check_logs(bench, sc, stage, finder)
    if result.status != "SUCCEEDED":
        _save_logs(bench, sc, stage.home, finder)
    return result


def _save_logs(bench: Bench, sc: Scenario, home: Path, finder: TaskFinder) -> None:
    """Every log line of the task, boot output included, beside the scenario (to debug it)."""
    plan = json.loads((home / "plan.json").read_text())
    for task_id in finder.task_ids():
        config = _client_config(home, task_id, plan["provider_config"])
        try:
            lines = handle(task_id, direct_provider(sc.provider, config, bench.account)).logs(
                source="all")
        except Exception as exc:  # kept for debugging only: say why there is none
            lines = [f"logs unreadable: {type(exc).__name__}: {exc}"]
        (home / f"logs-{task_id}.txt").write_text("\n".join(lines) + "\n")


def _settle_orphan(bench: Bench, sc: Scenario, stage: Stage, finder: TaskFinder,
                   deadline: float) -> None:
    """Until every task of the killed caller ended, or none of its nodes runs any more and
    (aws-sim) the caller's launch lease is stale, so ``flow gc`` may reclaim the launch."""
    from flow_sdk.errors import TaskNotFoundError

    plan = json.loads((stage.home / "plan.json").read_text())
    lease_stale = min(stage.struck_at) + (SIM_LEASE_TTL_S + 1.0 if sc.provider == "aws-sim"
                                          else 0.0)
    while time.monotonic() < deadline:
        ended = True
        for task_id in finder.task_ids():
            config = _client_config(stage.home, task_id, plan["provider_config"])
            try:
                task = handle(task_id, direct_provider(sc.provider, config, bench.account))
                ended = ended and task.status.is_terminal
            except TaskNotFoundError:
                continue
        if ended or (not stage.procs() and time.time() >= lease_stale):
            return
        time.sleep(0.25)


def started_wall(started_monotonic: float) -> float:
    return time.time() - (time.monotonic() - started_monotonic)


def _status(exited: bool, statuses: list[str], seen: list[dict[str, Any]]) -> str:
    if not exited or "HUNG" in statuses:
        return "HUNG"
    if "NO-OUTCOME" in statuses:  # after `flow gc` nothing runs, yet the task never ended
        return "NO-OUTCOME"
    if statuses:
        return statuses[-1]
    errors = [e for e in seen if e["event"] == "error"]
    return f"LAUNCH-FAILED ({errors[-1]['type']})" if errors else "NO-TASK"


def _check_results(sc: Scenario, seen: list[dict[str, Any]], finder: TaskFinder,
                   bench: Bench, home: Path) -> list[str]:
    ends = [e for e in seen if e["event"] == "end"]
    if ends:
        results = list(ends[-1]["results"])
    else:  # the caller was gone: read them as a user would, with Task.from_id
        task_id = finder.task_ids()[-1]
        plan = json.loads((home / "plan.json").read_text())
        config = _client_config(home, task_id, plan["provider_config"])
        results = handle(task_id, direct_provider(sc.provider, config, bench.account)).results()
    if "caller-sigint" in sc.kinds:  # ``.remote()``: rank 0's value, of a full-size world
        results = results[:1]
        world = _world(sc, finder, bench, home)
        expected = [compute(sc.seed, 0, world)]
        return [] if results == expected else [f"result differs: {results} != {expected}"]
    world = len(results)
    sizes = {n * sc.workers for n in range(sc.min_instances or sc.nodes, sc.nodes + 1)}
    if world not in sizes:
        return [f"results: {world} rank(s), expected one of {sorted(sizes)}"]
    expected = [compute(sc.seed, rank, world) for rank in range(world)]
    return [] if results == expected else [f"results differ: {results} != {expected}"]


def _world(sc: Scenario, finder: TaskFinder, bench: Bench, home: Path) -> int:
    """The world size the task ran with: its stored results count its ranks."""
    task_id = finder.task_ids()[-1]
    plan = json.loads((home / "plan.json").read_text())
    config = _client_config(home, task_id, plan["provider_config"])
    return len(handle(task_id, direct_provider(sc.provider, config, bench.account)).results())


def _check_logs(bench: Bench, sc: Scenario, stage: Stage, finder: TaskFinder) -> list[str]:
    """Every rank that started well before the first strike has its first line in the logs."""
    if not stage.struck_at or not finder.task_ids():
        return []
    cutoff = min(stage.struck_at) - LOG_SHIP_S[sc.provider]
    ranks = sorted({int(p.name.split("-")[1]) for p in stage.marks.glob("start-*")
                    if p.stat().st_mtime < cutoff})
    if not ranks:
        return []
    task_id = finder.task_ids()[-1]
    plan = json.loads((stage.home / "plan.json").read_text())
    config = _client_config(stage.home, task_id, plan["provider_config"])
    try:
        lines = handle(task_id, direct_provider(sc.provider, config, bench.account)).logs()
    except Exception as exc:  # an unreadable log is the finding: recorded, not raised
        return [f"logs unreadable: {type(exc).__name__}: {exc}"]
    text = "\n".join(lines)
    missing = [r for r in ranks if f"chaos-start rank {r}" not in text]
    return [f"logs: no line of rank(s) {missing} printed before the fault"] if missing else []
