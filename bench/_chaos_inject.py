"""Strike a scenario's faults at their phases, from outside the SDK: signals by PID, a full
filesystem, a taken port, the caller's own signals (SIGINT, SIGKILL, SIGUSR1 for cancel).

On Slurm (the bench's cluster, ``Stage.cluster``) a node is lost with its ``slurmd`` and the
job's processes on it, set down with ``scontrol``, or the job ``scancel``-ed; the time-limit
case freezes every process of the job and kills the caller, so only Slurm's ``--time`` ends
it. A phase is recognised by what can be seen: the task's record in the store (launch), a node
process (boot), an agent (rendezvous), every agent (barrier), a rank's start mark (training),
a done mark (result upload), every done mark (teardown). A fault whose phase or victim never
shows up within its wait is reported as missed, not struck.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _chaos_draw import Fault, Scenario
from _chaos_procs import (
    Proc,
    by_role,
    children_of,
    instance_order,
    node_victims,
    pool_workers,
    scan,
)

POLL_S = 0.05
SIGNALS = {"sigkill": signal.SIGKILL, "sigstop": signal.SIGSTOP}


@dataclass
class Stage:
    """What the harness knows of a running scenario (read by the fault threads)."""

    scenario: Scenario
    home: Path
    marks: Path
    caller_pid: int
    exclude: set[int]
    record_found: Callable[[], int | None]  # the store's rdzv port once the record exists
    cluster: Any = None  # the slurm lane's cluster (tests/slurm_cluster.SlurmCluster)
    stop: threading.Event = field(default_factory=threading.Event)
    log: list[str] = field(default_factory=list)
    struck_at: list[float] = field(default_factory=list)
    stopped_pids: list[int] = field(default_factory=list)
    sockets: list[socket.socket] = field(default_factory=list)

    def procs(self) -> list[Proc]:
        return scan(self.home, self.exclude)

    def note(self, text: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {text}")

    def marks_of(self, kind: str) -> list[str]:
        return [p.name for p in self.marks.iterdir() if p.name.startswith(kind)]


def _phase_reached(stage: Stage, phase: str) -> bool:
    sc = stage.scenario
    if phase == "launch":
        return stage.record_found() is not None
    procs = stage.procs()
    if phase == "boot":
        return any(p.instance for p in procs)
    agents = by_role(procs, "agent")
    if phase == "rendezvous":
        return bool(agents)
    if phase == "barrier":
        return len(instance_order(agents)) >= (sc.min_instances or sc.nodes)
    if phase == "training":
        return bool(stage.marks_of("start-"))
    if phase == "upload":
        return bool(stage.marks_of("done-"))
    return len({m.split("-")[1] for m in stage.marks_of("done-")}) >= sc.nodes * sc.workers


def wait_phase(stage: Stage, phase: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not stage.stop.is_set() and time.monotonic() < deadline:
        if _phase_reached(stage, phase):
            return True
        time.sleep(POLL_S)
    return False


def _victims(stage: Stage, fault: Fault) -> list[Proc]:
    role = fault.kind.split("-", 1)[1]
    procs = stage.procs()
    if role == "leader":
        return node_victims(procs, "agent", 0)
    if role == "sshd":
        keepers = node_victims(procs, "keeper", fault.node)
        return [c for k in keepers for c in children_of(procs, k.pid) if c.role == "sshd"]
    if role == "worker":
        return node_victims(procs, "worker", fault.node)[:1]
    return node_victims(procs, role, fault.node)


def _signal(stage: Stage, fault: Fault, deadline: float) -> bool:
    signum = SIGNALS[fault.kind.split("-", 1)[0]]
    while not stage.stop.is_set() and time.monotonic() < deadline:
        victims = _victims(stage, fault)
        if victims:
            for victim in victims:
                os.kill(victim.pid, signum)
                if signum == signal.SIGSTOP:
                    stage.stopped_pids.append(victim.pid)
                stage.note(f"{fault.kind}: {victim.describe()}")
            return True
        time.sleep(POLL_S)
    return False


def _slow_node(stage: Stage, fault: Fault) -> bool:
    procs = stage.procs()
    order = instance_order(by_role(procs, "agent") or procs)
    if not order:
        return False
    instance = order[min(fault.node, len(order) - 1)]
    frozen = []
    for proc in (p for p in procs if p.instance == instance):
        try:
            os.kill(proc.pid, signal.SIGSTOP)
        except ProcessLookupError:
            continue  # it exited meanwhile: nothing to freeze, nothing to thaw
        frozen.append(proc)
    stage.note(f"slow-node: froze {len(frozen)} process(es) of {instance} for {fault.hold_s}s")
    stage.stop.wait(fault.hold_s)
    for proc in frozen:
        try:
            os.kill(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            continue
    return True


def _slurm_fault(stage: Stage, fault: Fault) -> bool:
    cluster, procs = stage.cluster, stage.procs()
    if fault.kind == "scancel":
        listed = [job for job, name in (line.split() for line in cluster.run(
            "squeue", "-h", "--me", "-o", "%i %j").stdout.splitlines() if line.strip())
            if name.startswith("flow-")]  # the scenario's jobs
        for job in listed:
            cluster.run("scancel", job, check=False)
        stage.note(f"scancel: job(s) {listed}")
        return bool(listed)
    if fault.kind == "time-limit":
        for proc in procs:
            try:
                os.kill(proc.pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
        os.kill(stage.caller_pid, signal.SIGKILL)
        stage.note(f"time-limit: froze {len(procs)} process(es), killed the caller")
        return True
    agents = node_victims(procs, "agent", fault.node)
    node = agents[0].slurm_node if agents else None
    if node is None:
        return False
    if fault.kind == "node-down":
        cluster.run("scontrol", "update", f"nodename={node}", "state=down", "reason=chaos")
        stage.note(f"node-down: {node}")
        return True
    os.kill(cluster.pids[f"slurmd-{node}"], signal.SIGKILL)
    lost = [p for p in procs if p.slurm_node == node]
    for proc in lost:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    stage.note(f"sigkill-slurmd: {node} and {len(lost)} process(es) of the job there")
    return True


def _kill_pool_worker(stage: Stage, fault: Fault, deadline: float) -> bool:
    while not stage.stop.is_set() and time.monotonic() < deadline:
        victims = pool_workers(stage.procs(), fault.node)
        if victims:
            os.kill(victims[0].pid, signal.SIGKILL)
            stage.note(f"pool-kill: {victims[0].describe()}")
            return True
        time.sleep(POLL_S)
    return False


def fill(mount: Path) -> str:
    """Fill the small filesystem at ``mount`` to its last byte; says how full it was."""
    try:
        filler = open(mount / "chaos-filler", "wb", buffering=0)
    except OSError as exc:
        return f"already full ({exc.strerror})"
    with filler:
        free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
        try:
            os.posix_fallocate(filler.fileno(), 0, max(free, 1))
        except OSError:
            pass  # ENOSPC: what was left is taken by the partial allocation
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError:
            return f"filled ({free} bytes were free)"  # ENOSPC: full


def _take_port(stage: Stage, deadline: float) -> bool:
    while not stage.stop.is_set() and time.monotonic() < deadline:
        port = stage.record_found()
        if port is not None and port in [s.getsockname()[1] for s in stage.sockets]:
            stage.note(f"port-taken: holding the store's port {port} since before the launch")
            return True
        if port is not None:
            held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                held.bind(("0.0.0.0", port))
            except OSError as exc:
                stage.note(f"port-taken: {port} already bound ({exc}): too late")
                held.close()
                return False
            held.listen(1)
            stage.sockets.append(held)
            stage.note(f"port-taken: holding the store's port {port}")
            return True
        time.sleep(0.005)
    return False


def strike(stage: Stage, fault: Fault, disk: Path | None, timeout_s: float) -> None:
    """Wait for the fault's phase, then strike; records the time it struck."""
    deadline = time.monotonic() + timeout_s
    if fault.kind == "port-taken":
        hit = _take_port(stage, deadline)
    elif fault.kind in ("ec2-error", "s3-error", "pool-idle-stop"):
        hit = True  # armed before the caller started
    elif fault.kind == "none":
        return
    else:
        hit = wait_phase(stage, fault.phase, timeout_s)
        if hit and fault.delay_s:
            stage.stop.wait(fault.delay_s)
        if hit and not stage.stop.is_set():
            hit = _apply(stage, fault, disk, deadline)
    if hit:
        stage.struck_at.append(time.time())
    else:
        stage.note(f"{fault.kind}@{fault.phase}: missed (phase or victim never seen)")


def _apply(stage: Stage, fault: Fault, disk: Path | None, deadline: float) -> bool:
    kind = fault.kind
    if kind in ("sigkill-slurmd", "node-down", "scancel", "time-limit"):
        return _slurm_fault(stage, fault)
    if kind.startswith(("sigkill-", "sigstop-")):
        return _signal(stage, fault, deadline)
    if kind == "pool-kill":
        return _kill_pool_worker(stage, fault, deadline)
    if kind in ("caller-sigint", "caller-sigkill", "cancel"):
        signum = {"caller-sigint": signal.SIGINT, "caller-sigkill": signal.SIGKILL,
                  "cancel": signal.SIGUSR1}[kind]
        try:
            os.kill(stage.caller_pid, signum)
        except ProcessLookupError:
            return False
        stage.note(f"{kind}: caller {stage.caller_pid}")
        return True
    if kind == "slow-node":
        return _slow_node(stage, fault)
    if kind == "disk-full" and disk is not None:
        stage.note(f"disk-full: {disk} {fill(disk)}")
        return True
    return False


def start_strikes(stage: Stage, disk: Path | None, timeout_s: float) -> list[threading.Thread]:
    threads = [threading.Thread(target=strike, args=(stage, f, disk, timeout_s), daemon=True)
               for f in stage.scenario.faults]
    for thread in threads:
        thread.start()
    return threads


def small_disk(target: Path, size: str) -> Path:
    """A small filesystem (tmpfs of ``size``) mounted at ``target``: the nodes' disk."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "chaos-disk",
                    str(target)], check=True)
    return target


def release_disk(target: Path) -> bool:
    """Unmount the small filesystem; False while something still holds it."""
    done = subprocess.run(["umount", str(target)], capture_output=True, check=False)
    return done.returncode == 0
