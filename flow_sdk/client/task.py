"""The client-side handle of a running or finished task."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, Literal, overload

from flow_sdk import lifecycle, payload, wire
from flow_sdk.home import tasksecrets
from flow_sdk.wire import signing
from flow_sdk.client import ssh as _ssh, taskstate
from flow_sdk.client.failure import task_error
from flow_sdk.client.records import load_client_record, note_last_seen
from flow_sdk.client.stacks import Stacks, task_stacks
from flow_sdk.client.timeline import Timeline, task_timeline
from flow_sdk.errors import (
    FieldProblem,
    ProviderError,
    SignatureError,
    SshError,
    SshUnavailableError,
    TaskError,
    TaskNotFoundError,
    TaskTimeoutError,
    ValidationError,
)
from flow_sdk.client.cost import cost_per_hour as _cost_per_hour
from flow_sdk.client.cost import estimated_cost as _estimated_cost
from flow_sdk.wire import (
    LaunchRecord,
    NodeRecord,
    Outcome,
    TaskRecord,
    TaskStatus,
)
from flow_sdk.providers import attach_provider
from flow_sdk.providers.base import Instance, Provider, SshEndpoint
from flow_sdk.spec import TaskSpec
from flow_sdk.client.ssh import SshResult
from flow_sdk.client.tasklogs import LogSource, TaskLogs
from flow_sdk.wire.pools import pool_of_task


class Task:
    """A task launched by ``RemoteFunction.spawn`` (or re-attached with ``Task.from_id``).

    Every record and result it reads is checked against the task's secret before use (a
    forged or altered one raises ``SignatureError`` naming its key, and nothing of it is
    unpickled). The secret is the 0600 file the launching client saved under the flow data
    directory (``$FLOW_HOME/secrets``), so only that user on that machine can read results.
    """

    def __init__(self, task_id: str, provider: Provider) -> None:
        self.task_id, self.provider = task_id, provider
        self._nodes_id = pool_of_task(task_id) or task_id  # its nodes' id: its own, its pool's
        self._torn_down = False
        self._teardown_lock = threading.Lock()  # one teardown at a time (cancel() vs wait())
        self._spec: TaskSpec | None = None
        self._logs = TaskLogs(task_id, provider, slots_per_node=self._slots_per_node,
                              node_of_instances=self._node_of_instances,
                              ended=lambda: self.status.is_terminal)
        self._signed: signing.SignedStore | None = None

    @property
    def store(self) -> signing.SignedStore:
        """The provider's object store seen through the task's secret (read when first used)."""
        if self._signed is None:
            self._signed = signing.SignedStore(
                self.provider.store, lambda: tasksecrets.load_task_secret(self.task_id))
        return self._signed

    def __repr__(self) -> str:
        return f"Task({self.task_id!r}, provider={self.provider.name!r})"

    @classmethod
    def from_id(cls, task_id: str) -> Task:
        data = load_client_record(task_id)
        return cls(task_id, attach_provider(data["provider"], data["provider_config"]))

    # -- state ------------------------------------------------------------------------------

    def record(self) -> TaskRecord:
        key = wire.task_key(self.task_id)
        raw = self.provider.store.get(key)
        if raw is None:
            raise TaskNotFoundError(f"task {self.task_id!r} has no record in the "
                                    f"{self.provider.name} store")
        return TaskRecord.from_json(self.store.check_record(key, raw))

    def outcome(self) -> Outcome | None:
        """The outcome recorded in the store, or None while no one reported one."""
        return lifecycle.outcome_of(self.store, self.task_id)

    def instances(self) -> list[Instance]:
        """The task's nodes as the provider reports them, by instance id: its own, or the
        pool nodes it was given (gang and spares, its launch record names them)."""
        instances = self.provider.list_instances(self._nodes_id)
        if self._nodes_id == self.task_id:
            return instances
        given = {n.instance_id for n in (self._launch_record() or LaunchRecord(0, [])).nodes}
        return [i for i in instances if i.instance_id in given]

    def nodes(self) -> list[NodeRecord]:
        """The node records the agents wrote; an unsealed object there is passed over."""
        found = []
        for key in self.store.list(wire.nodes_prefix(self.task_id)):
            try:
                data = self.store.get_record(key)
            except SignatureError:
                continue
            if data is not None:
                found.append(NodeRecord.from_json(data))
        return found

    @property
    def status(self) -> TaskStatus:
        """The task's state, read from its records and nodes; reading it writes nothing (a
        task whose nodes all vanished reads FAILED before ``wait`` records why)."""
        return taskstate.judge(self).status

    def waiting(self) -> str | None:
        """Why the task's nodes wait in a scheduler's queue, in its words ("queued by Slurm:
        Resources (...)"); None when no node waits for a reason the provider gives."""
        return taskstate.waiting(self.instances())

    def final_outcome(self) -> Outcome | None:
        """The recorded outcome, else, once the task ended without one, the outcome the
        caller judges for it (recorded by ``wait``); None while the task runs."""
        outcome = self.outcome()
        if outcome is not None:
            return outcome
        status, judged, _ = taskstate.judge(self)
        if not status.is_terminal:
            return None
        return self.outcome() or judged or self._vanished()

    def _vanished(self) -> Outcome:
        """The judged outcome of a task whose nodes all exited without reporting one."""
        agent = self.logs(source="agent", tail=10)
        boot = [] if agent else self.logs(source="boot", tail=20)
        return lifecycle.nodes_vanished(agent, boot, self.provider.scheduler_end(self._nodes_id))

    @property
    def spec(self) -> TaskSpec:
        """The task's options as it was launched with them (read from its signed record)."""
        if self._spec is None:
            self._spec = TaskSpec.model_validate(self.record().spec)
        return self._spec

    @property
    def num_instances(self) -> int:
        """How many nodes the task was launched on."""
        return self.spec.num_instances

    @property
    def max_price_per_hour(self) -> float | None:
        """The price cap in USD per instance-hour (None: uncapped)."""
        return self.spec.max_price_per_hour

    def _launch_record(self) -> LaunchRecord | None:
        raw = self.store.get_record(wire.launch_key(self.task_id))
        return None if raw is None else LaunchRecord.from_json(raw)

    @property
    def cost_per_hour(self) -> float:
        """USD per hour for all of the task's nodes (0 before launch and for local nodes)."""
        launch = self._launch_record()
        return _cost_per_hour(launch) if launch is not None else 0.0

    def cost_so_far(self, now: float | None = None) -> float:
        """USD spent: hourly price x nodes x time since launch; final once the task ended.
        ``now`` (epoch seconds) defaults to the current time."""
        launch = self._launch_record()
        if launch is None:
            return 0.0
        outcome = self.outcome()
        return _estimated_cost(launch, outcome.finished_at if outcome is not None else None,
                               time.time() if now is None else now)

    @property
    def estimated_cost(self) -> float:
        """``cost_so_far()`` at this moment: live while the task runs, final after."""
        return self.cost_so_far()

    def wait(self, timeout: float | None = None) -> TaskStatus:
        """Block until the task ends; returns its terminal status. Tears the nodes down."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while True:
            status, judged, _ = taskstate.judge(self)
            if status.is_terminal:
                status = self._settle(judged)
                self._teardown()
                note_last_seen(self.task_id, {"status": str(status)})  # kept past the store
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TaskTimeoutError(f"task {self.task_id} is still {status} after "
                                       f"{timeout}s; it keeps running (cancel() stops it)")
            time.sleep(delay)
            delay = min(delay * 1.2, 0.5)

    def _settle(self, judged: Outcome | None) -> TaskStatus:
        """Record the outcome of an ended task that has none (``judged``, else that of nodes
        that vanished); the recorded status."""
        if self.outcome() is None:
            lifecycle.record_outcome(self.store, self.task_id, judged or self._vanished())
        outcome = self.outcome()
        assert outcome is not None
        return TaskStatus(outcome.status)

    def _teardown(self) -> None:
        """Stop the task's own nodes (a pool's nodes stay: their daemons sweep them)."""
        with self._teardown_lock:
            if not self._torn_down and self._nodes_id == self.task_id:
                self.provider.terminate(self.task_id)
            self._torn_down = True

    def cancel(self) -> None:
        """Stop every worker on every node and tear the nodes down. No-op once the task ended."""
        self.store.put_record(wire.cancel_key(self.task_id),
                              {"by": "the caller", "at": time.time()})
        lifecycle.record_outcome(self.store, self.task_id, lifecycle.cancelled_by_caller())
        self._torn_down = False
        self._teardown()

    def result(self, timeout: float | None = None) -> Any:
        """Rank 0's return value; re-raises a remote exception with its remote traceback."""
        if self.wait(timeout) is not TaskStatus.SUCCEEDED:
            raise self._error()
        return self._load_result(0)

    def results(self, timeout: float | None = None) -> list[Any]:
        """Every rank's return value, by rank."""
        if self.wait(timeout) is not TaskStatus.SUCCEEDED:
            raise self._error()
        keys = self.provider.store.list(wire.results_prefix(self.task_id))
        ranks = sorted(n for k in keys if (n := wire.key_number(k.rsplit("/", 1)[1])) is not None)
        return [self._load_result(rank) for rank in ranks]

    def _load_result(self, rank: int) -> Any:
        raw = self.store.get_blob(wire.result_key(self.task_id, rank))
        if raw is None:
            raise TaskError(f"task {self.task_id} succeeded but rank {rank} stored no result",
                            task_id=self.task_id, status=TaskStatus.SUCCEEDED.value)
        return payload.loads(raw)

    def timeline(self) -> Timeline:
        """When each node reached each phase (requested, instance running, boot, code
        installed, agent up, joined, barrier released, first worker line, generations, end);
        ``flow timeline`` draws it."""
        return task_timeline(self)

    def stacks(self, node: int | None = None, timeout: float = 20.0) -> Stacks:
        """Every worker's Python stacks while the task runs (only ``node``'s workers when
        given), with the ranks that stand apart from the rest (``Stacks.odd_ranks``)."""
        return task_stacks(self, node, timeout)

    def error(self) -> BaseException | None:
        """The exception ``result()`` raises once the task ended without success, else None."""
        status = self.status
        return None if not status.is_terminal or status is TaskStatus.SUCCEEDED else self._error()

    def _error(self) -> BaseException:
        outcome = self.final_outcome()
        assert outcome is not None
        return task_error(self.store, self.task_id, outcome)

    # -- logs -------------------------------------------------------------------------------

    def _slots_per_node(self) -> int:
        try:
            return self.spec.slots_per_node
        except TaskNotFoundError:
            return 1

    def _node_of_instances(self) -> dict[str, int]:
        """instance id -> node index: from the node records the agents publish, else (a node
        that never reached the rendezvous) its place among the sorted instance ids."""
        found = {n.instance_id: n.node for n in self.nodes()}
        for index, instance in enumerate(self.instances()):
            found.setdefault(instance.instance_id, index)
        return found

    @overload
    def logs(self, node: int | None = ..., tail: int | None = ..., follow: Literal[False] = ...,
             since: float | None = ..., source: LogSource = ..., rank: int | None = ...
             ) -> list[str]: ...

    @overload
    def logs(self, node: int | None = ..., tail: int | None = ..., *, follow: Literal[True],
             since: float | None = ..., source: LogSource = ..., rank: int | None = ...
             ) -> Iterator[str]: ...

    def logs(self, node: int | None = None, tail: int | None = None, follow: bool = False,
             since: float | None = None, source: LogSource = "workers",
             rank: int | None = None) -> list[str] | Iterator[str]:
        """Log lines labelled ``[Node i] [HH:MM:SS]`` (plus the rank when a node runs several
        workers), merged in time order across nodes. ``since`` is an epoch time; ``rank``
        keeps one global rank's output. ``source``: ``"workers"`` (what user code printed,
        with the task's events — lost node, restart, replacements, generation — as SDK lines
        labelled ``[flow]``), ``"agent"`` (the node agents' own lines), ``"boot"`` (each
        node's raw boot output, readable even when a node died before user code) or
        ``"all"``. ``follow=True`` yields lines as they are written until the task ends.
        Logs outlive the nodes. A ``node`` or ``rank`` the task lacks raises
        ``ValidationError``."""
        self.check_node(node)
        self.check_rank(rank)
        lines = self._logs.lines(node, tail, follow, since, source, rank)
        if follow:
            return (self._logs.format(ln) for ln in lines)
        return [self._logs.format(ln) for ln in lines]

    def log_entries(self, node: int | None = None, tail: int | None = None,
                    follow: bool = False, since: float | None = None,
                    source: LogSource = "workers", rank: int | None = None,
                    color: bool = False) -> Iterator[dict[str, Any]]:
        """The lines of ``logs()`` as dicts: ``ts`` (epoch), ``node``, ``rank`` (None for
        agent, boot and event lines), ``kind`` ("worker", "flow", "agent" or "boot") and
        ``text``, and ``line``, the labelled line ``logs()`` gives (colour kept: ``color``)."""
        self.check_node(node)
        self.check_rank(rank)
        return self._logs.entries(node, tail, follow, since, source, rank, color)

    def check_node(self, node: int | None) -> None:
        """Raise ``ValidationError`` when the task has no node ``node``."""
        if node is None:
            return
        try:
            count = self.num_instances
        except TaskNotFoundError:
            return
        if not 0 <= node < count:
            raise ValidationError([FieldProblem("node", (
                f"task {self.task_id} has {count} node(s), 0..{count - 1}; there is no node "
                f"{node}"))])

    def check_rank(self, rank: int | None) -> None:
        """Raise ``ValidationError`` when the task has no worker of global rank ``rank``."""
        if rank is None:
            return
        try:
            world = TaskSpec.model_validate(self.record().spec).world_size
        except TaskNotFoundError:
            return
        if not 0 <= rank < world:
            raise ValidationError([FieldProblem("rank", (
                f"task {self.task_id} has {world} worker(s), ranks 0..{world - 1}; there is "
                f"no rank {rank}"))])

    # -- ssh --------------------------------------------------------------------------------

    def _reachable(self, node: int) -> str:
        """The instance id of node ``node`` of a task that runs (else SshUnavailableError)."""
        self.check_node(node)
        status = self.status
        if status.is_terminal:
            raise SshUnavailableError(
                f"task {self.task_id} has ended ({status}); its nodes and their SSH servers "
                f"are gone. Its logs remain: task.logs(node={node}) or `flow logs "
                f"{self.task_id} --node {node}`")
        for record in self.nodes():
            if record.node == node:
                return record.instance_id
        instances = self.instances()
        if 0 <= node < len(instances):  # before the rendezvous: ranks follow sorted ids
            return instances[node].instance_id
        raise SshError(f"task {self.task_id} has {len(instances)} node(s); there is no node {node}")

    def ssh_endpoint(self, node: int = 0) -> SshEndpoint:
        """Where node ``node`` answers SSH, with the host key pinned when it launched. A
        ``node`` the task lacks raises ``ValidationError``, whether or not the task runs."""
        instance_id = self._reachable(node)
        try:
            return self.provider.ssh_endpoint(self._nodes_id, instance_id)
        except ProviderError as exc:
            raise SshUnavailableError(f"node {node} of task {self.task_id}: {exc}") from exc

    @overload
    def ssh(self, node: int = ..., command: None = ..., *, timeout: float | None = ...) -> int: ...

    @overload
    def ssh(self, node: int = ..., *, command: str, timeout: float | None = ...) -> SshResult: ...

    def ssh(self, node: int = 0, command: str | None = None, *, timeout: float | None = None
            ) -> int | SshResult:
        """SSH to node ``node`` (on Slurm: an ``srun`` step in its job). With ``command``: run
        it in the node's working directory and return ``SshResult(exit_code, stdout,
        stderr)``. Without: open an interactive shell on this terminal; its exit code. The
        host key is the one pinned at launch; any other raises ``HostKeyMismatchError``."""
        argv = self.provider.shell_command(self._nodes_id, self._reachable(node), command)
        if argv is not None:  # the provider reaches its nodes through its scheduler
            return _ssh.run_local(argv, command, timeout)
        endpoint = self.ssh_endpoint(node)
        if command is None:
            return _ssh.interactive_shell(endpoint)
        return _ssh.run_command(endpoint, command, timeout=timeout)
