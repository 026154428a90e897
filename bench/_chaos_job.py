"""The caller of one chaos scenario, as a user's own script: ``python _chaos_job.py SCENARIO``.

``SCENARIO`` is a JSON file (``_chaos_run.CallerPlan``): the scenario, the provider config and
the job's marks directory. The caller launches the job with the SDK's public API, then writes
what it saw as JSON lines to the plan's ``events`` file: ``spawned`` (task id), then ``end``
(status and every rank's result; rank 0's alone when the scenario Ctrl-Cs the caller, which
then waits in ``.remote()``, whose Ctrl-C cancels the task) or ``error`` (its type and
message). SIGUSR1 asks it to
``cancel()`` the task (at once, or as soon as ``spawn()`` returned); SIGINT is Ctrl-C; SIGUSR2
dumps every thread's stack to its output (the harness asks when the caller hangs).

The job itself (``chaos_job``) leaves marks the harness watches to find the phases: a
``start-RANK-PID`` file when a rank starts, ``done-RANK-PID`` just before it returns; each
step appends to a scratch file in the node's working directory (its disk) and prints a line.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

SIM_LEASE_TTL_S = 4.0  # the launch lease (120 s by default): a killed caller's launch is
# reclaimable by ``flow gc`` after this long, as in tests/faults/test_launch_interrupt.py


def compute(seed: int, rank: int, world: int) -> str:
    """A rank's result: the same for the same (seed, rank, world), fault or not."""
    digest = hashlib.sha256(f"{seed}:{rank}:{world}".encode()).digest()
    for _ in range(2000):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:24]


def chaos_job(seed: int, steps: int, step_s: float, marks: str) -> str:
    from flow_sdk import current

    rank, world = current.rank, current.world_size
    Path(marks, f"start-{rank}-{os.getpid()}").touch()
    print(f"chaos-start rank {rank}", flush=True)
    for step in range(steps):
        time.sleep(step_s)
        with open(f"scratch-{rank}.txt", "a") as scratch:  # the node's disk
            scratch.write("x" * 4096)
        print(f"chaos-step {step} rank {rank}", flush=True)
    Path(marks, f"done-{rank}-{os.getpid()}").touch()
    return compute(seed, rank, world)


class Caller:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.events = open(plan["events"], "a", buffering=1)
        self.task: Any = None
        self.cancel_asked = threading.Event()

    def emit(self, event: str, **fields: Any) -> None:
        self.events.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")

    def on_usr1(self, signum: int, frame: FrameType | None) -> None:
        self.cancel_asked.set()

    def canceller(self) -> None:
        self.cancel_asked.wait()
        while self.task is None:
            time.sleep(0.02)
        self.task.cancel()
        self.emit("cancelled")

    def function(self) -> Any:
        from flow_sdk import FlowApp

        scenario, plan = self.plan["scenario"], self.plan
        app = FlowApp("chaos", provider=scenario["provider"],
                      provider_config=plan["provider_config"])
        options: dict[str, Any] = {
            "num_instances": scenario["nodes"], "workers_per_node": scenario["workers"],
            "max_restarts": scenario["max_restarts"], "quiet": True, "confirm": False,
            "availability_timeout_s": plan["availability_timeout_s"],
            "boot_timeout_s": plan["boot_timeout_s"],
            "max_run_time_hours": plan["runtime_cap_s"] / 3600}
        if scenario["min_instances"] is not None:
            options["min_instances"] = scenario["min_instances"]
        if plan.get("pool"):
            options.update(pool=plan["pool"], idle_stop=plan["pool_idle_stop_s"])
            del options["max_restarts"], options["boot_timeout_s"]
        return app.function(**options)(chaos_job)

    def pool_up(self) -> None:
        """Warm the pool first; the idle-stop fault launches as its idle stop fires."""
        from flow_sdk import pool_up

        scenario, plan = self.plan["scenario"], self.plan
        pool_up(plan["pool"], provider=scenario["provider"], num_instances=scenario["nodes"],
                workers_per_node=scenario["workers"], idle_stop=plan["pool_idle_stop_s"])
        self.emit("pool-up")
        time.sleep(plan.get("launch_after_s", 0.0))

    def run(self) -> int:
        scenario = self.plan["scenario"]
        signal.signal(signal.SIGUSR1, self.on_usr1)
        threading.Thread(target=self.canceller, daemon=True).start()
        try:
            if self.plan.get("pool"):
                self.pool_up()
            args = (scenario["seed"], scenario["steps"], scenario["step_s"], self.plan["marks"])
            if "caller-sigint" in [f["kind"] for f in scenario["faults"]]:
                # a blocking call, as a user's script makes one: Ctrl-C cancels the task
                self.emit("end", status="SUCCEEDED", results=[self.function().remote(*args)])
                return 0
            self.task = self.function().spawn(*args)
            self.emit("spawned", task_id=self.task.task_id)
            results = self.task.results(timeout=self.plan["bound_s"])
            self.emit("end", status="SUCCEEDED", results=results)
            return 0
        except Exception as exc:  # the outcome is the measurement: every error is recorded
            status = str(self.task.status) if self.task is not None else None
            self.emit("error", type=type(exc).__name__, message=str(exc)[-2000:],
                      status=status)
            return 1
        finally:
            self.pool_down()

    def pool_down(self) -> None:
        if self.plan.get("pool"):
            from flow_sdk import Pool

            Pool.named(self.plan["pool"]).down()
            self.emit("pool-down")


def main(argv: list[str]) -> int:
    plan = json.loads(Path(argv[1]).read_text())
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # the harness asks on a hang
    if plan["scenario"]["provider"] == "aws-sim":
        from flow_sdk.providers.aws import _lease

        _lease.TTL_S, _lease.RENEW_S = SIM_LEASE_TTL_S, SIM_LEASE_TTL_S / 4
    if "rdzv_port" in plan:  # port-taken on local nodes: the port the harness holds
        from flow_sdk.system import procs
        from flow_sdk.providers.local import LocalProvider

        taken = int(plan["rdzv_port"])

        def ports(self: LocalProvider) -> tuple[int, int]:
            return taken, procs.free_port()

        LocalProvider.rendezvous_ports = ports  # type: ignore[method-assign]
    return Caller(plan).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
