"""The pool daemon: one per pool node, running the pool's tasks on it one after another.

For each assignment (in the pool's order, each sealed with the pool's secret) the daemon:

1. opens the task's own secret, sealed under the pool's, and refuses anything not sealed so;
2. a spare ("standby") waits until a later generation of the task names it, or the task ends;
3. makes a fresh working directory (with its own ``TMPDIR``) and forks the task's agent from
   this warm process, in a session of its own, with the environment the daemon started with
   plus the task's own; the agent forks its workers from the same template;
4. waits for the agent, stopping it if it outlives the task's outcome (the one sealed with
   the task's secret: ``lifecycle.ended``; a forged one ends nothing);
5. sweeps the node (``sweep``): every process of the task (known by the daemon's process tree
   and the task's cgroup, never by what it says of itself) killed and reaped, its directory
   removed, GPU memory released; a node that cannot be swept clean leaves the pool;
6. re-arms the idle stop (``timer``) and reports itself idle.

A spare that takes a rank asks the provider for a new spare, so the pool keeps its size.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from flow_sdk.system import procs
from flow_sdk import lifecycle, wire
from flow_sdk.errors import FlowError, RecordError, SignatureError, TaskSecretError
from flow_sdk.node.agent.main import Agent, serve
from flow_sdk.node.agent.spawn import Template, prepare_template
from flow_sdk.node.pool.sweep import Own, TaskCgroup, reap, sweep, tracking
from flow_sdk.node.pool.timer import IdleTimer
from flow_sdk.providers import get_provider
from flow_sdk.providers.base import LaunchRequest
from flow_sdk.spec import TaskSpec
from flow_sdk.wire import (
    BootConfig,
    MembershipRecord,
    TaskRecord,
    signing,
    take_node_boot,
)
from flow_sdk.wire.pools import (
    Assignment,
    MemberRecord,
    PoolRecord,
    assignment_key,
    assignments_prefix,
    left_key,
    member_key,
    pool_key,
)
from flow_sdk.wire import envvars

POLL_MIN_S = 0.05  # how often an idle node looks for work within FAST_WINDOW_S of a task
POLL_MAX_S = 0.25  # ... and after that (a listing of the store costs a request)
FAST_WINDOW_S = 120.0  # edit, run, look: the next task usually comes within minutes
OUTCOME_CHECK_S = 0.5
LINGER_S = 15.0  # an agent still running this long after its task's outcome is stopped


class PoolDaemon:
    """The daemon of one pool node."""

    def __init__(self, boot: BootConfig, instance_id: str, address: str, root: Path) -> None:
        self.boot, self.instance_id, self.address, self.root = boot, instance_id, address, root
        self.pool_id = boot.task_id
        self.provider = get_provider(boot.provider, boot.provider_config)
        self.secret = signing.secret_from_hex(boot.secret)
        self.store = signing.SignedStore(self.provider.store, self.secret)
        self.base_env = {k: v for k, v in os.environ.items() if k not in (envvars.BOOT,
                                                                          envvars.BOOT_FILE)}
        self.code_dir = root / "code"
        self.tasks_dir = root / "tasks"
        self.timer = IdleTimer(os.environ)
        self.template: Template | None = None
        self.own = Own()  # what the daemon started itself (spares): not the task's, not swept
        self.done: set[int] = set()  # assignments served, by number
        self.refused: dict[int, bytes] = {}  # assignments refused, as they were then
        self.idle_since = time.time()
        self.stopping = False

    def log(self, message: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} pool daemon: {message}", flush=True)

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> int:
        self.log(f"started on {self.instance_id} ({self.address}), pool {self.pool_id}")
        for folder in (self.code_dir, self.tasks_dir):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not procs.become_subreaper():
            self.log("cannot become a child subreaper: processes a task detaches may escape "
                     "the sweep")
        record = self._pool_record()
        if record is None:
            return 1
        self.template = prepare_template()
        self.log(f"worker template: {self.template.describe()}; idle stop after "
                 f"{record.idle_stop_s:g}s by {self.timer.describe()}")
        if not self._idle(record):
            return 1
        delay = POLL_MIN_S
        while not self.stopping:
            assignment = self._next_assignment()
            if assignment is None:
                if self.timer.expired():
                    self.log(f"idle for {record.idle_stop_s:g}s: stopping the node")
                    self._member("stopping")
                    return 0
                time.sleep(delay)
                if time.time() - self.idle_since > FAST_WINDOW_S:
                    delay = min(POLL_MAX_S, delay * 1.1)
                continue
            cgroup = TaskCgroup.create(assignment.task_id)
            self._serve(assignment, record, cgroup)
            swept = sweep(self.tasks_dir / assignment.task_id, self.own, cgroup, self.log)
            self.log(f"task {assignment.task_id}: {swept.describe()}")
            if not swept.clean:
                self.log("leaving the pool: the node could not be swept clean")
                self._member("stopping")
                return 1
            if not self._idle(record):
                return 1
            delay = POLL_MIN_S
        return 0

    def _pool_record(self) -> PoolRecord | None:
        try:
            raw = self.store.get_record(pool_key(self.pool_id))
            if raw is None:
                self.log("the pool has no record (its `pool up` did not get that far); "
                         "stopping")
                return None
            return PoolRecord.from_json(raw)
        except (SignatureError, RecordError) as exc:
            self.log(f"refused the pool record: {exc}; stopping")
            return None

    def _idle(self, record: PoolRecord) -> bool:
        """Arm the idle stop and report the node idle; False (the node must stop) when the
        stop cannot be armed."""
        self.idle_since = time.time()
        try:
            self.timer.arm(record.idle_stop_s)
        except FlowError as exc:
            self.log(f"{exc}; powering off")
            return False
        self._member("idle")
        return True

    def _member(self, state: str, task_id: str = "", agent_pid: int = 0) -> None:
        template = self.template.describe() if self.template is not None else "starting"
        self.store.put_record(member_key(self.pool_id, self.instance_id), MemberRecord(
            self.instance_id, self.address, state, task_id, self.idle_since,
            self.timer.deadline if state == "idle" else None, time.time(), template,
            agent_pid))

    def _next_assignment(self) -> Assignment | None:
        """The first assignment of this node it has not served, in the pool's order; one not
        sealed with the pool's secret is refused (logged and skipped)."""
        for key in self.provider.store.list(assignments_prefix(self.pool_id,
                                                               self.instance_id)):
            number = wire.key_number(key.rsplit("/", 1)[1].split(".", 1)[0])
            if number is None or number in self.done:
                continue
            raw = self.provider.store.get(key)
            if raw is None or self.refused.get(number) == raw:
                continue
            try:
                assignment = Assignment.from_json(self.store.check_record(key, raw))
            except (SignatureError, RecordError) as exc:
                self.refused[number] = raw  # looked at again only when it changes
                self.log(f"refused assignment {number}: {exc}")
                continue
            self.done.add(number)
            if assignment.number != number or not assignment.task_id.startswith(
                    self.pool_id + ".") or key != assignment_key(self.pool_id,
                                                                 self.instance_id, number):
                self.log(f"refused assignment {number}: it names task "
                         f"{assignment.task_id!r} of another pool or place")
                continue
            return assignment
        return None

    # -- one task ----------------------------------------------------------------------------

    def _serve(self, a: Assignment, record: PoolRecord, cgroup: TaskCgroup | None) -> None:
        key = assignment_key(self.pool_id, self.instance_id, a.number)
        try:
            secret = signing.open_secret(self.secret, key, a.sealed_secret).hex()
            task_store = signing.SignedStore(self.provider.store,
                                             signing.secret_from_hex(secret))
            raw = task_store.get_record(wire.task_key(a.task_id))
            if raw is None:
                raise RecordError(f"task {a.task_id} has no record")
            task = TaskRecord.from_json(raw)
        except (SignatureError, RecordError, TaskSecretError) as exc:
            self.log(f"refused task {a.task_id}: {exc}")
            return
        boot = BootConfig(a.task_id, self.boot.provider, self.boot.provider_config, secret)
        spec = TaskSpec.model_validate(task.spec)
        self.timer.hold(None if spec.max_run_time_hours is None else
                        spec.max_run_time_hours * 3600)
        if a.role == "standby":
            self._member("standby", a.task_id)
            if not self._called(task_store, a.task_id):
                self.log(f"task {a.task_id} ended without needing this spare")
                return
            self.log(f"task {a.task_id} takes this spare into its gang")
        workdir = self.tasks_dir / a.task_id
        workdir.mkdir(mode=0o700)
        (workdir / "tmp").mkdir(mode=0o700)
        pid = self._fork_agent(boot, workdir, cgroup)
        self._member("busy", a.task_id, pid)
        self.log(f"task {a.task_id}: agent {pid} forked from the warm template; the task's "
                 f"processes are known by {tracking(cgroup)}")
        if a.role == "standby":
            self._replenish(record)
        self._wait(pid, task_store, a.task_id)

    def _called(self, task_store: signing.SignedStore, task_id: str) -> bool:
        """Stand by until a later generation's membership names this node (True) or the task
        ends (False)."""
        seen: set[str] = set()
        prefix = wire.membership_key(task_id, 0).rsplit("/", 1)[0] + "/"
        while not self.stopping:
            if lifecycle.ended(task_store, task_id) is not None:
                return False
            for key in self.provider.store.list(prefix):
                if key in seen or key == wire.membership_key(task_id, 0):
                    continue
                seen.add(key)
                try:
                    raw = task_store.get_record(key)
                except SignatureError as exc:
                    self.log(f"ignored a forged membership record: {exc}")
                    continue
                if raw is not None and any(m.instance_id == self.instance_id for m in
                                           MembershipRecord.from_json(raw).members):
                    return True
            time.sleep(0.1)
        return False

    def _fork_agent(self, boot: BootConfig, workdir: Path, cgroup: TaskCgroup | None) -> int:
        return _fork(lambda: self._agent(boot, workdir, cgroup))

    def _agent(self, boot: BootConfig, workdir: Path, cgroup: TaskCgroup | None) -> int:
        """In the forked child: the task's agent, in the task's cgroup where there is one, in
        a session of its own that dies with the daemon, in the task's directory and
        environment."""
        if cgroup is not None and (problem := cgroup.enter()):
            self.log(problem)
        os.setsid()
        procs.die_with_parent()
        for sig in (signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(workdir)
        os.environ.clear()
        os.environ.update({**self.base_env, envvars.NODE_WORKDIR: str(workdir),
                           "TMPDIR": str(workdir / "tmp")})
        return serve(Agent(boot, self.instance_id, self.address, workdir,
                           template=self.template, code_cache=self.code_dir))

    def _wait(self, pid: int, task_store: signing.SignedStore, task_id: str) -> None:
        """Until the agent exits; stopped when it outlives the task's outcome, or when the
        daemon is asked to stop."""
        ended_at: float | None = None
        next_check = 0.0
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                self.log(f"task {task_id}: agent exited ({code})")
                if lifecycle.ended(task_store, task_id) is None:
                    task_store.put_record(left_key(task_id, self.instance_id), {
                        "instance_id": self.instance_id, "exit_code": code, "at": time.time()})
                return
            now = time.monotonic()
            if self.stopping:
                _kill_session(pid)
            elif now >= next_check:
                next_check = now + OUTCOME_CHECK_S
                if ended_at is None and lifecycle.ended(task_store, task_id) is not None:
                    ended_at = now
                if ended_at is not None and now - ended_at > LINGER_S:
                    self.log(f"task {task_id}: agent outlived the task's outcome; stopping it")
                    _kill_session(pid)
            reap_others(pid)
            time.sleep(0.02)

    def _replenish(self, record: PoolRecord) -> None:
        """After a spare took a rank: start new nodes until the pool has its size again, from
        a helper process. Where the nodes are processes here they sit below the helper, which
        the daemon tracks as its own (``Own``): the sweep leaves them alone."""
        self.own.add(_fork(lambda: self._start_spares(record)))

    def _start_spares(self, record: PoolRecord) -> int:
        """In the helper: start the missing nodes through a provider of its own (it shares no
        connection with the daemon's), then, a subreaper, collect their processes until none
        is left."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        procs.become_subreaper()
        provider = get_provider(self.boot.provider, self.boot.provider_config)
        try:
            running = [i for i in provider.list_instances(self.pool_id)
                       if i.state == "running"]
            missing = record.size + record.spares - len(running)
            if missing > 0:
                added = provider.add_instances(LaunchRequest(
                    self.pool_id, TaskSpec.model_validate(record.spec), self.boot), missing)
                self.log(f"started {len(added)} new spare node(s): "
                         f"{', '.join(i.instance_id for i in added)}")
        except FlowError as exc:
            self.log(f"could not start a new spare: {exc}")
        while True:
            try:
                os.wait()
            except ChildProcessError:
                return 0


def _fork(run: Callable[[], int]) -> int:
    """A child process of the daemon that runs ``run`` and exits with its code."""
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            code = run()
        except BaseException:  # noqa: BLE001 - whatever happens, the child must exit here
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid


def reap_others(agent_pid: int) -> None:
    """Collect exited orphans (not the agent: its status is read by ``_wait``)."""
    try:
        for pid in [p for p in _children() if p != agent_pid]:
            os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return


def _children() -> list[int]:
    try:
        text = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def main() -> int:
    boot, instance_id, address = take_node_boot()  # the secret's traces go with it
    daemon = PoolDaemon(boot, instance_id, address,
                        Path(os.environ.get(envvars.NODE_WORKDIR, os.getcwd())))

    def on_term(signum: int, frame: FrameType | None) -> None:
        daemon.stopping = True

    signal.signal(signal.SIGTERM, on_term)
    try:
        return daemon.run()
    finally:
        reap()
