"""Run one chaos scenario and judge it: terminal state within its bound, nothing left behind,
logs readable up to the fault, results equal to the fault-free computation's.

``Bench`` holds what the scenarios of one run share: their root directory, for the
simulated cloud one account (its moto server, started as the simulated cloud starts it) with
the fault proxy in front of it and the image's SDK environments, and for the slurm lane a
Slurm cluster (``tests/slurm_cluster.py``: munged, slurmctld, four slurmd on loopback),
brought back to every node idle after each scenario.
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _chaos_draw import Scenario
from _chaos_inject import Stage, release_disk, small_disk, start_strikes
from _chaos_judge import judge
from _chaos_account import Account
from _chaos_leaks import leftovers, purge_account
from _chaos_procs import scan
from _chaos_proxy import FaultProxy, Rule
from _chaos_tasks import TaskFinder
from flow_sdk.providers.slurm._batch import time_limit_minutes

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "tests"))
from slurm_cluster import SlurmCluster  # noqa: E402

# per provider: availability timeout, boot timeout, runtime cap beyond the job's work (s)
TIMEOUTS = {"local": (6.0, 20.0, 15.0), "aws-sim": (25.0, 60.0, 30.0),
            "slurm": (20.0, 40.0, 20.0)}
# for the nodes to stop after the terminal state (slurm: a lost node's job is ended by the
# controller, after SlurmdTimeout and KillWait)
SETTLE_S = {"local": 15.0, "aws-sim": 30.0, "slurm": 40.0}
SLURM_SUBNET = 230  # the bench cluster's loopback 127.230.0.0/16 (the tests' are 60-200)
POOL_IDLE_STOP_S = 8.0  # above the 5 s margin inside which a pool node takes no task
DISK_SIZE = "64m"  # the small filesystem of a full-disk fault (tmpfs)


@dataclass
class Result:
    seed: int
    provider: str
    kinds: list[str]
    phases: list[str]
    describe: str
    status: str  # the terminal status, LAUNCH-FAILED, HUNG, or NO-OUTCOME (none after gc)
    terminal_s: float  # from the first strike (else the start) to the terminal state
    bound_s: float
    struck: int
    leaks: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # results or logs that should be there
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        failed = ("HUNG", "HARNESS-ERROR", "NO-OUTCOME")
        return self.status not in failed and not self.leaks and not self.lost

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


class Bench:
    """What one run's scenarios share (a context manager: stops what it started, by PID)."""

    def __init__(self, root: Path, sim: bool, envs: Path | None = None,
                 slurm: bool = False, cluster: SlurmCluster | None = None) -> None:
        self.root = root
        self.sim = sim
        # the slurm lane's cluster: given (a test session's), or started here when ``slurm``
        self.cluster = cluster
        self.own_cluster = slurm and cluster is None
        # the simulated image's SDK environments (by wheel digest): ``root/sim-envs`` unless
        # given, e.g. one a test session's simulated clouds share (built once, not per bench)
        self.envs = envs or root / "sim-envs"
        self.server: subprocess.Popen[bytes] | None = None
        self.account: Account | None = None  # the account, directly
        self.proxy: FaultProxy | None = None
        self.known: set[str] = set()  # task ids of earlier scenarios (the account is shared)

    def __enter__(self) -> Bench:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.sim:
            self._start_account()
        if self.own_cluster:
            self.cluster = SlurmCluster.start(self.root / "slurm", nodes=4, subnet=SLURM_SUBNET)
        if self.cluster is not None:  # the callers, `flow gc` and the harness ask this one
            os.environ["SLURM_CONF"] = str(self.cluster.conf)
        return self

    def _start_account(self) -> None:
        home = self.root / "account"
        home.mkdir(exist_ok=True)
        state = home / "server.json"
        state.unlink(missing_ok=True)
        with open(home / "server.log", "ab") as log:
            self.server = subprocess.Popen(
                [sys.executable, "-m", "flow_sdk.sim._serve", str(home), "86400"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + 60
        while not state.exists():
            if time.monotonic() > deadline or self.server.poll() is not None:
                raise RuntimeError(f"the simulated account did not start; see {home}/server.log")
            time.sleep(0.05)
        port = int(json.loads(state.read_text())["port"])
        self.account = Account(f"http://127.0.0.1:{port}", home)
        self.proxy = FaultProxy(port).start()

    def __exit__(self, *exc: object) -> None:
        if self.own_cluster and self.cluster is not None:
            self.cluster.stop()
        if self.proxy is not None:
            self.proxy.stop()
        if self.server is not None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()

    def provider_config(self, sc: Scenario, home: Path) -> dict[str, Any]:
        if sc.provider == "local":
            return {}
        if sc.provider == "slurm":
            return {"shared_dir": str(home / "slurm-shared")}
        assert self.proxy is not None and self.account is not None
        return {**self.account.provider_config(self.proxy.url), "root": str(home / "sim-root"),
                "envs": str(self.envs)}


def bound_of(sc: Scenario) -> float:
    """The longest a scenario may take to reach a terminal state: the boot timeout, then per
    generation the availability timeout and the runtime cap, plus teardown slack."""
    avail, boot, cap = TIMEOUTS[sc.provider]
    if "time-limit" in sc.kinds:  # the job's --time: the cap and the grace, in minutes
        return boot + 60.0 * time_limit_minutes((cap + sc.steps * sc.step_s) / 3600) + 60.0
    return boot + (1 + sc.max_restarts) * (avail + cap + sc.steps * sc.step_s) + 30.0


def caller_plan(bench: Bench, sc: Scenario, home: Path) -> dict[str, Any]:
    avail, boot, cap = TIMEOUTS[sc.provider]
    plan: dict[str, Any] = {
        "scenario": json.loads(sc.to_json()), "events": str(home / "events.jsonl"),
        "marks": str(home / "marks"), "provider_config": bench.provider_config(sc, home),
        "availability_timeout_s": avail, "boot_timeout_s": boot,
        "runtime_cap_s": cap + sc.steps * sc.step_s, "bound_s": bound_of(sc)}
    if sc.pooled:
        plan.update(pool=f"chaos{sc.seed}", pool_idle_stop_s=POOL_IDLE_STOP_S)
        if "pool-idle-stop" in sc.kinds:
            # 2 to 8 s after the pool is warm: taken, refused near its stop, or at the stop
            plan["launch_after_s"] = 2.0 + sc.faults[0].delay_s * 10
    return plan


def events(home: Path) -> list[dict[str, Any]]:
    path = home / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _port_held_first(sc: Scenario) -> socket.socket | None:
    """For ``port-taken`` on local nodes (which share this machine's ports): a port this
    harness holds before the launch, which the caller then picks for the task's store (as if
    another process took it between the pick and the store's bind). Racing the store for a
    port picked at launch is lost whenever the node starts faster than this harness looks.
    Cloud nodes own their ports: there the strike still takes the port once it is known."""
    if "port-taken" not in sc.kinds or sc.provider != "local":
        return None
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("0.0.0.0", 0))
    held.listen(1)
    return held


def _disk_target(sc: Scenario, home: Path) -> Path | None:
    if "disk-full" not in sc.kinds:
        return None
    return home / ("local/nodes" if sc.provider == "local" else "sim-root/nodes")


def run_scenario(bench: Bench, sc: Scenario, name: str | None = None) -> Result:
    """Run ``sc`` end to end, judge it, and clean up whatever it left (after counting it).
    It runs in ``bench.root / name`` (default ``s<seed>``: name it when one bench runs a seed
    more than once, e.g. with other pinned kinds)."""
    started = time.monotonic()
    home = bench.root / (name or f"s{sc.seed}")
    (home / "marks").mkdir(parents=True, exist_ok=True)
    os.environ["FLOW_HOME"] = str(home)
    disk = _disk_target(sc, home)
    if disk is not None:
        small_disk(disk, DISK_SIZE)
    plan = caller_plan(bench, sc, home)
    held = _port_held_first(sc)
    if held is not None:
        plan["rdzv_port"] = held.getsockname()[1]
    (home / "plan.json").write_text(json.dumps(plan))
    if bench.proxy is not None:
        bench.proxy.book.arm([Rule(**f.rule) for f in sc.faults if f.rule])
    finder = TaskFinder(home, bench.account, bench.known)
    caller = subprocess.Popen([sys.executable, str(BENCH / "_chaos_job.py"),
                               str(home / "plan.json")], stdin=subprocess.DEVNULL,
                              stdout=open(home / "caller.log", "wb"), stderr=subprocess.STDOUT,
                              env={**os.environ, "FLOW_HOME": str(home)})
    stage = Stage(sc, home, home / "marks", caller.pid, {os.getpid(), caller.pid},
                  finder.rdzv_port, bench.cluster)
    if held is not None:
        stage.sockets.append(held)
    if bench.server is not None:
        stage.exclude.add(bench.server.pid)
    strikes = start_strikes(stage, disk, bound_of(sc))
    try:
        result = judge(bench, sc, stage, caller, finder, started)
    except Exception as exc:  # a harness failure is a failed scenario, shown with its cause
        result = Result(sc.seed, sc.provider, sc.kinds, [f.phase for f in sc.faults],
                        sc.describe(), "HARNESS-ERROR", 0.0, bound_of(sc), 0,
                        lost=[f"harness error: {type(exc).__name__}: {exc}"])
    finally:
        stage.stop.set()
        for thread in strikes:
            thread.join(timeout=10)
        if bench.proxy is not None:
            bench.proxy.book.disarm()
            result_notes = bench.proxy.book.injected
        else:
            result_notes = []
    result.notes = stage.log + [f"injected {n}" for n in result_notes] + result.notes
    _finish(bench, sc, stage, caller, disk, home, result)
    bench.known.update(finder.task_ids())
    result.wall_s = round(time.monotonic() - started, 2)
    return result


def _finish(bench: Bench, sc: Scenario, stage: Stage, caller: subprocess.Popen[bytes],
            disk: Path | None, home: Path, result: Result) -> None:
    """Count what is left, then remove it (so the next scenario starts clean)."""
    for held in stage.sockets:
        held.close()
    if caller.poll() is None:  # hung: its stacks go to caller.log, then it is stopped
        caller.send_signal(signal.SIGUSR2)
        time.sleep(0.5)
        caller.kill()
    caller.wait()
    # the time-limit case: nothing ends the frozen job before Slurm's --time does
    settle = bound_of(sc) if "time-limit" in sc.kinds else SETTLE_S[sc.provider]
    try:
        found = leftovers(home, bench.account, stage.exclude - {caller.pid}, settle, disk)
        result.leaks += found
        if found:
            for proc in scan(home, stage.exclude):
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
            if bench.account is not None:
                purge_account(bench.account)
        if sc.provider == "slurm" and bench.cluster is not None:
            _restore(bench.cluster, result, home)
    finally:  # the small filesystem goes even when the account could not be asked
        if disk is not None and not release_disk(disk):
            time.sleep(1)
            if not release_disk(disk):
                result.leaks.append(f"mount {disk} still busy")
                subprocess.run(["umount", "-l", str(disk)], check=False)


def _restore(cluster: SlurmCluster, result: Result, home: Path) -> None:
    """Count the jobs the scenario left in the queue, cancel them, and bring every node back
    (a killed slurmd, a node set down) for the next scenario. In the time-limit case the
    job must have been ended by Slurm's ``--time`` (``TIMEOUT``)."""
    if "time-limit" in result.kinds:
        shown = cluster.run("scontrol", "-o", "show", "job", check=False).stdout
        ends = [f"{line.split('JobId=')[1].split()[0]} {line.split('JobState=')[1].split()[0]}"
                for line in shown.splitlines() if f"Command={home}/" in line]
        result.notes.append(f"time-limit: job(s) ended {ends}")
        if not ends or any(not end.endswith(" TIMEOUT") for end in ends):
            result.lost.append(f"time-limit: the job was not ended by Slurm's --time: {ends}")
    left = cluster.jobs_left(within_s=5.0)
    if left:
        result.leaks += [f"slurm job {line}" for line in left.splitlines()]
        cluster.run("scancel", "--full", "-u", getpass.getuser(), check=False)
    cluster.revive()
