"""The Slurm provider's render of the node-launch contract (``providers.launch.NodeLaunch``):
a task is one batch job whose script ``srun``s one node bootstrap per node, and the launch
file that bootstrap reads. Pure: text in, text out.

The job: ``--nodes`` with one task per node, ``--time`` from the runtime cap plus the
scheduler's grace (``wire.runtimecap.SCHEDULER``, so the controller ends the job even with the
caller gone and every agent frozen), ``--no-requeue`` (a task is never run twice), a name and
a comment that identify the task (``flow gc`` finds its jobs by them, and never touches
others), the GPUs per node, and the site's options from the provider config.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from flow_sdk.providers.launch import NodeLaunch
from flow_sdk.wire import envvars
from flow_sdk.wire.runtimecap import SCHEDULER

JOB_PREFIX = "flow-"  # every job of ours is named flow-TASK_ID
COMMENT_PREFIX = "flow-task:"  # ... and carries the comment flow-task:TASK_ID
INSTANCE_ID = "sl{job}-{node:04d}"  # node k of job J; sorts in node order, as ranks follow


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


def time_limit_minutes(cap_hours: float) -> int:
    """``--time`` for a task with this runtime cap: the cap and the scheduler's grace, in
    whole minutes, rounded up."""
    return math.ceil(cap_hours * 60) + SCHEDULER.grace_minutes()


def render_batch_script(launch: NodeLaunch, *, task_id: str, nodes: int, time_minutes: int,
                        gpus_per_node: str | None, options: JobOptions, python: str,
                        boot_script: Path, launch_file: Path, output: Path) -> str:
    """The job's batch script: its ``#SBATCH`` options, then one ``srun`` step that runs the
    node bootstrap once on each node."""
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name(task_id)}",
             f"#SBATCH --comment={job_comment(task_id)}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --time={time_minutes}",
             "#SBATCH --no-requeue",
             f"#SBATCH --output={output}",
             "#SBATCH --open-mode=append"]
    if gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    for flag, value in (("partition", options.partition), ("account", options.account),
                        ("qos", options.qos), ("constraint", options.constraint)):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    lines += [f"#SBATCH {extra}" for extra in options.extra_sbatch]
    step = ["srun", "--ntasks-per-node=1", f"--nodes={nodes}", "--kill-on-bad-exit=0",
            python, "-I", "-S", str(boot_script), str(launch_file)]
    lines += ["set -eu", f"# task {task_id}: {launch.module} on each node",
              "exec " + shlex.join(step)]
    return "\n".join(lines) + "\n"


def render_launch_file(launch: NodeLaunch, *, task_id: str, wheels: Sequence[Mapping[str, str]],
                       envs: Path, boot_files: Path, nodes_dir: Path) -> str:
    """What each node's bootstrap reads (JSON): the wheels (path, SHA-256, file name) and the
    Python they need, where to build their environment once per set of digests, each node's
    0600 boot file (by ``SLURM_NODEID``), its working folder, the instance id's form, the
    module to run, and the names of the variables it sets for the agent."""
    return json.dumps({
        "task_id": task_id, "python": launch.python, "module": launch.module,
        "wheels": list(wheels), "envs": str(envs), "boot_files": str(boot_files),
        "nodes_dir": str(nodes_dir), "instance_id": INSTANCE_ID,
        "names": {"boot_file": envvars.BOOT_FILE, "instance_id": envvars.INSTANCE_ID,
                  "address": envvars.NODE_ADDRESS, "cores": envvars.NODE_CORES},
    }, indent=1, sort_keys=True)
