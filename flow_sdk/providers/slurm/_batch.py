"""The Slurm provider's render of the node-launch contract (``providers.launch.NodeLaunch``):
a task is one batch job whose script ``srun``s one node bootstrap per node, and the launch
file that bootstrap reads. Pure: text in, text out.

The job: ``--nodes`` (``MIN-MAX`` with ``min_instances``: Slurm may then start it on fewer)
with one task per node, ``--time`` from the runtime cap plus the
scheduler's grace (``wire.runtimecap.SCHEDULER``, so the controller ends the job even with the
caller gone and every agent frozen), ``--no-requeue`` (a task is never run twice), a name and
a comment that identify the task (``flow gc`` finds its jobs by them, and never touches
others), the GPUs per node, the task's priority (a QoS the site maps it to, or ``--nice``),
``--no-kill`` where spares stand by (a lost node must not end the job), a warning signal before
the time limit (a task's workers that catch SIGUSR1 can write a checkpoint), and the site's
options from the provider config.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flow_sdk.providers.launch import NodeLaunch
from flow_sdk.wire import envvars
from flow_sdk.wire.runtimecap import SCHEDULER

JOB_PREFIX = "flow-"  # every job of ours is named flow-TASK_ID
COMMENT_PREFIX = "flow-task:"  # ... and carries the comment flow-task:TASK_ID
INSTANCE_ID = "sl{job}-{node:04d}"  # node k of job J; sorts in node order, as ranks follow
# The time limit's warning: the node agent's worker.WARNING_SIGNAL, five minutes before the
# limit (three before the runtime cap: the limit is the cap plus the scheduler's grace).
WARNING_SIGNAL = "USR1"
WARN_BEFORE_S = 300
LOW_PRIORITY_NICE = 10000  # ``priority="low"`` where no QoS is named for it: behind the rest


def warn_before_s(time_minutes: int) -> int:
    """When the job's warning comes, before its time limit: ``WARN_BEFORE_S``, or half the
    limit of a shorter job (else it would come as the job starts)."""
    return min(WARN_BEFORE_S, time_minutes * 30)


def job_name(task_id: str) -> str:
    return JOB_PREFIX + task_id


def job_comment(task_id: str) -> str:
    return COMMENT_PREFIX + task_id


def instance_id(job_id: str, node: int) -> str:
    """The instance id of node ``node`` (``SLURM_NODEID``) of job ``job_id``."""
    return INSTANCE_ID.format(job=job_id, node=node)


@dataclass(frozen=True)
class JobOptions:
    """What the site's configuration adds to each job (checked by the provider)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    extra_sbatch: tuple[str, ...] = ()  # further "#SBATCH ..." options, as given
    priority_qos: Mapping[str, str] = field(default_factory=dict)  # priority -> QoS name

    def priority_options(self, priority: str) -> list[str]:
        """The options that give a job the task's priority: the QoS the site names for it,
        else ``--nice`` for ``low`` (any user may lower a job's priority; raising it takes a
        QoS the site grants), else none (``med``, and ``high`` without a QoS: ``notes``)."""
        qos = self.priority_qos.get(priority)
        if qos:
            return [f"--qos={qos}"]
        return [f"--nice={LOW_PRIORITY_NICE}"] if priority == "low" else []


def time_limit_minutes(cap_hours: float) -> int:
    """``--time`` for a task with this runtime cap: the cap and the scheduler's grace, in
    whole minutes, rounded up."""
    return math.ceil(cap_hours * 60) + SCHEDULER.grace_minutes()


def render_batch_script(launch: NodeLaunch, *, task_id: str, nodes: int, time_minutes: int,
                        gpus_per_node: str | None, options: JobOptions, python: str,
                        boot_script: Path, launch_file: Path, output: Path,
                        min_nodes: int | None = None, priority: str = "med",
                        spares: int = 0, warn_before_s: int | None = None) -> str:
    """The job's batch script: its ``#SBATCH`` options, then one ``srun`` step that runs the
    node bootstrap once on each node the job was given."""
    counts = f"{min_nodes}-{nodes}" if min_nodes not in (None, nodes) else str(nodes)
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name(task_id)}",
             f"#SBATCH --comment={job_comment(task_id)}",
             f"#SBATCH --nodes={counts}",  # no task count: Slurm would size a range by it
             f"#SBATCH --time={time_minutes}",
             "#SBATCH --no-requeue",
             f"#SBATCH --output={output}",
             "#SBATCH --open-mode=append"]
    if gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    if spares:  # a lost node must not end the job: a spare takes its rank
        lines.append("#SBATCH --no-kill")
    if warn_before_s:  # every process of the job gets it; workers that catch it checkpoint
        lines.append(f"#SBATCH --signal={WARNING_SIGNAL}@{warn_before_s}")
    chosen = options.priority_options(priority)
    qos = None if any(o.startswith("--qos=") for o in chosen) else options.qos
    for flag, value in (("partition", options.partition), ("account", options.account),
                        ("qos", qos), ("constraint", options.constraint)):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    lines += [f"#SBATCH {option}" for option in chosen]
    lines += [f"#SBATCH {extra}" for extra in options.extra_sbatch]
    # the step runs on every node of the allocation, however many Slurm gave (min_nodes)
    step = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
            python, "-I", "-S", str(boot_script), str(launch_file)]
    lines += ["set -eu", f"# task {task_id}: {launch.module} on each node",
              "exec " + shlex.join(step)]
    return "\n".join(lines) + "\n"


def render_launch_file(launch: NodeLaunch, *, task_id: str, wheels: Sequence[Mapping[str, str]],
                       envs: Path, boot_files: Path, nodes_dir: Path, boot_log: str) -> str:
    """What each node's bootstrap reads (JSON): the wheels (path, SHA-256, file name) and the
    Python they need, where to build their environment once per set of digests, each node's
    0600 boot file (by ``SLURM_NODEID``), its working folder, the instance id's form, its boot
    stream's file (``{instance}`` in ``boot_log`` stands for its instance id), the module to
    run, and the names of the variables it sets for the agent."""
    return json.dumps({
        "task_id": task_id, "python": launch.python, "module": launch.module,
        "boot_log": boot_log,
        "wheels": list(wheels), "envs": str(envs), "boot_files": str(boot_files),
        "nodes_dir": str(nodes_dir), "instance_id": INSTANCE_ID,
        "names": {"boot_file": envvars.BOOT_FILE, "instance_id": envvars.INSTANCE_ID,
                  "address": envvars.NODE_ADDRESS, "cores": envvars.NODE_CORES},
    }, indent=1, sort_keys=True)
