"""A job's life as the Slurm controller reports it: its state (``squeue`` first, then
``scontrol show job``, which keeps an ended job a while; never ``sacct``, which needs the
accounting database), the nodes it was given with their addresses, what ended it when the
task did not, and its cancel."""

from __future__ import annotations

import os
import threading
import time

from flow_sdk.errors import ProviderError
from flow_sdk.providers.base import SchedulerEnd
from flow_sdk.providers.slurm._commands import (
    JOB_FIELDS,
    Cluster,
    JobState,
    SlurmCommandError,
    job_from_scontrol,
    parse_records,
    parse_squeue,
)

QUEUE_FRESH_S = 1.0  # how long one listing of the user's queue answers for every job
_QUEUES: dict[tuple[object, str], tuple[float, dict[str, JobState]]] = {}  # by cluster
_QUEUES_LOCK = threading.Lock()
CANCEL_POLL_S = 0.5  # how often a cancel asks whether the job is over
STOP_WAIT_S = 30.0  # after scancel, how long a cancel waits for the job to leave the nodes
# how long a task's running job has to end by itself before scancel: agents check for a
# cancel every 2 s, then stop their workers (SIGTERM, then SIGKILL after 5 s)
CANCEL_GRACE_S = 15.0
_DOWN_STATES = ("DOWN", "DRAIN", "FAIL")  # words of a node state that took a job's node away


class Jobs:
    """The cluster's jobs, by job id."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def queued(self, job_id: str) -> JobState | None:
        """The job as ``squeue`` shows it; None once it has left the queue (``squeue -j``
        then refuses the id)."""
        try:
            output = self.cluster.run(["squeue", "-h", "-j", job_id, "-o", JOB_FIELDS])
        except SlurmCommandError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise
        return parse_squeue(output).get(job_id)

    def listed(self, job_id: str) -> JobState | None:
        """The job as one ``squeue --me`` of every job of this user shows it: taken at most
        ``QUEUE_FRESH_S`` ago, and shared by every provider of this process on the same
        cluster (``flow list`` of many tasks asks once). None when it was not listed then."""
        key = self._queue_key()
        with _QUEUES_LOCK:
            taken = _QUEUES.get(key)
        if taken is None or time.monotonic() - taken[0] > QUEUE_FRESH_S:
            taken = (time.monotonic(), parse_squeue(self.cluster.run(
                ["squeue", "-h", "--me", "-o", JOB_FIELDS])))
            with _QUEUES_LOCK:
                _QUEUES[key] = taken
        return taken[1].get(job_id)

    def _queue_key(self) -> tuple[object, str]:
        """The cluster a listing is of: the machine the commands run on, and its config."""
        return self.cluster.host, os.environ.get("SLURM_CONF", "")

    def state(self, job_id: str) -> JobState | None:
        """The job: in the queue (``listed``) first, then ``scontrol`` (a job stays there a
        while after it ends, and one submitted since the listing is there too); None when
        neither knows it."""
        return self.listed(job_id) or self._shown(job_id)

    def _shown(self, job_id: str) -> JobState | None:
        try:
            records = parse_records(self.cluster.run(["scontrol", "-o", "show", "job",
                                                      job_id]))
        except SlurmCommandError:  # "Invalid job id specified": it ended a while ago
            return None
        return job_from_scontrol(records[0]) if records else None

    def nodes(self, node_list: str) -> list[tuple[str, str]]:
        """Each node of a job's node list as (name, ``NodeAddr``), in the job's node order
        (``SLURM_NODEID``)."""
        return [(name, record.get("NodeAddr", "")) for name, record in self._shown_nodes(
            node_list)]

    def _shown_nodes(self, node_list: str) -> list[tuple[str, dict[str, str]]]:
        """Each node of a job's node list with its ``scontrol show node`` fields, in the job's
        node order."""
        names = self.cluster.run(["scontrol", "show", "hostnames", node_list]).split()
        shown = {r.get("NodeName", ""): r for r in parse_records(self.cluster.run(
            ["scontrol", "-o", "show", "node", node_list]))}
        return [(name, shown.get(name, {})) for name in names]

    def ended_by(self, job_id: str) -> SchedulerEnd | None:
        """What Slurm says ended the job: cancelled from outside (``scancel``), one of its
        nodes going down (named, with Slurm's reason for it), or another end of Slurm's own
        (``TIMEOUT``, ``PREEMPTED``, ``NODE_FAIL``...); None for a job that completed, still
        runs, or that Slurm no longer knows."""
        job = self._shown(job_id)
        if job is None or not job.over or job.state == "COMPLETED":
            return None
        if job.state == "CANCELLED":
            return SchedulerEnd(f"slurm: job {job_id} was CANCELLED from outside the task "
                                "(`scancel` by its user or an administrator)", cancelled=True)
        down = self.down_nodes(job.nodes)
        return SchedulerEnd(f"slurm: job {job_id} ended {job.state}"
                            + (f": {'; '.join(down)}" if down else ""))

    def down_nodes(self, node_list: str) -> list[str]:
        """The nodes of a job's node list that are down, drained or failing, each as "node K
        (NAME) is STATE: REASON", K its place in the job (its ``SLURM_NODEID``)."""
        found = []
        for node, (name, record) in enumerate(self._shown_nodes(node_list) if node_list else []):
            state = record.get("State", "")
            if any(word in state for word in _DOWN_STATES):
                reason = record.get("Reason", "").split(" [")[0] or "no reason given"
                found.append(f"node {node} ({name}) is {state.lower()}: {reason}")
        return found

    def cancel(self, task_id: str, job_id: str, grace_s: float = 0.0) -> None:
        """End the job, and wait until Slurm has ended every process of it (the job has left
        ``COMPLETING``). A running job first has ``grace_s`` to end by itself (its agents
        stop on the task's signed cancel or outcome, and the job ends COMPLETED with its
        logs whole); what still runs then is cancelled with ``scancel``."""
        try:
            if self._wait_over(job_id, grace_s, until_not_running=True):
                return
            self.cluster.run(["scancel", "--full", job_id])
            if not self._wait_over(job_id, STOP_WAIT_S):
                raise ProviderError(f"slurm: job {job_id} of task {task_id} was cancelled but "
                                    f"still runs after {STOP_WAIT_S:.0f}s; see `squeue -j "
                                    f"{job_id}`")
        finally:
            self._ended()

    def _wait_over(self, job_id: str, within_s: float, until_not_running: bool = False
                   ) -> bool:
        """Whether the job is over within ``within_s``. With ``until_not_running`` a job that
        has not started (still queued) ends the wait at once; one ending by itself
        (``COMPLETING``) is waited for."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            job = self.queued(job_id)
            if job is None or job.over:
                return True
            if until_not_running and not (job.running or job.state == "COMPLETING"):
                return False
            time.sleep(CANCEL_POLL_S)
        return False

    def _ended(self) -> None:
        """A job ended: the process's listing of the queue, taken before, says no more."""
        with _QUEUES_LOCK:
            _QUEUES.pop(self._queue_key(), None)


def _after_fork_in_child() -> None:
    global _QUEUES_LOCK
    _QUEUES_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
