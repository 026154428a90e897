"""Slurm's commands, run where they are on ``PATH`` (a login node, or a node of the job), and
what their output says, parsed strictly.

Everything the provider asks the cluster goes through ``Cluster.run``: one command, its
standard output, or ``SlurmCommandError`` with what it printed. The parsers are pure
functions of that output (``scontrol -o`` lines of ``Key=Value`` fields; ``squeue`` lines in
the format the provider asks for), so they are tested on recorded output too.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flow_sdk.errors import ProviderError
from flow_sdk.providers.host import LOCAL, Host

COMMAND_TIMEOUT_S = 60.0
RETRY_WAITS_S = (0.5, 1.0, 2.0, 4.0)  # between the tries of a read the controller refused
_READS = ("squeue", "scontrol", "sinfo")  # what may run again (never sbatch: a second job)
# what Slurm's commands print when the controller is busy or limits this user's calls
_BUSY = ("Socket timed out", "Unable to contact slurm controller",
         "Resource temporarily unavailable", "RPC rate limit", "Rate limit exceeded")
JOB_FIELDS = "%i|%T|%N|%r"  # squeue's format: job id, state, node list, reason
NAMED_JOB_FIELDS = JOB_FIELDS + "|%j|%k"  # ... then the job's name and its comment


class SlurmCommandError(ProviderError):
    """A Slurm command failed or could not be run."""


@dataclass(frozen=True)
class JobState:
    """A job as the controller reports it."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED, FAILED, TIMEOUT ...
    nodes: str  # its node list, as Slurm writes it ("n[1-2]"); "" while it has none
    reason: str  # why it waits ("Priority", "Resources"), "None" when it does not

    @property
    def active(self) -> bool:
        """Still holding or waiting for nodes (not ended)."""
        return self.state in ACTIVE_STATES

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def over(self) -> bool:
        """Ended, with every process of it gone (past ``COMPLETING``, while Slurm kills
        them; ``scontrol`` shows how it ended only after that)."""
        return not self.active and self.state != "COMPLETING"


ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED",
                           "RESIZING", "SIGNALING", "STAGE_OUT"})


class Cluster:
    """Slurm's commands on ``host``'s ``PATH``: this machine's unless given (a login node
    reached over SSH)."""

    def __init__(self, host: Host = LOCAL, login: str | None = None) -> None:
        self.host = host
        self.login = login  # ``host`` is this login node, reached over SSH

    @property
    def where(self) -> str:
        """The machine the commands run on, in words."""
        return "here" if self.login is None else f"on the login node {self.login}"

    def run(self, argv: Sequence[str]) -> str:
        """Run one Slurm command; its standard output. A read the controller answers busy
        (it rate-limits each user's calls) is tried again after ``RETRY_WAITS_S``."""
        for wait in (*RETRY_WAITS_S, None):
            code, out, err = self.host.run(list(argv), COMMAND_TIMEOUT_S)
            if wait is None or code in (0, 124, 127) or argv[0] not in _READS or not any(
                    word in err for word in _BUSY):
                break
            time.sleep(wait)
        if code == 127 and self.login is not None:
            raise SlurmCommandError(
                f"slurm: `{argv[0]}` is not on PATH {self.where}, as ssh runs a command there "
                "(a shell that is not a login shell may not load the site's profile or "
                f"modules): see `ssh {self.login} which {argv[0]}`, and name a login node "
                "whose PATH has Slurm's commands in provider_config['login']")
        if code == 127:
            raise SlurmCommandError(
                f"slurm: `{argv[0]}` is not on PATH {self.where}: run on a login node of the "
                "cluster (where sbatch, squeue and scontrol are), or reach one with "
                "provider_config['login'] = 'user@host'")
        if code == 124:
            raise SlurmCommandError(f"slurm: `{' '.join(argv)}` did not answer within "
                                    f"{COMMAND_TIMEOUT_S:.0f}s; is the controller up?")
        if code != 0:
            said = (err.strip() or out.strip()).splitlines()
            raise SlurmCommandError(f"slurm: `{' '.join(argv)}` exited {code}: "
                                    f"{said[-1] if said else 'no output'}")
        return out


# What Slurm's commonest reasons for a pending job mean to the person waiting; others are shown
# as Slurm words them. Limits of a QoS or an account (``QOS...``, ``Assoc...``) need the
# accounting database, which many clusters have.
_REASONS = {
    "Priority": "jobs of higher priority are ahead of it",
    "Resources": "the nodes it needs are busy",
    "Dependency": "it waits for another job",
    "BeginTime": "its start time has not come",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "PartitionNodeLimit": "it asks for more nodes than its partition allows",
    "PartitionTimeLimit": "it asks for more time than its partition allows",
    "JobHeldUser": "a user held it (`scontrol release JOBID` lets it go)",
    "JobHeldAdmin": "an administrator held it",
    "Reservation": "it waits for its reservation",
}


def waiting(job: JobState) -> str:
    """Why a job that has not started waits, for the person waiting: Slurm's reason and, for
    the common ones, what it means."""
    if job.state != "PENDING":
        return f"Slurm is starting its nodes ({job.state})"
    reason = job.reason.strip()
    if reason in ("", "None"):
        return "queued by Slurm"
    meaning = _REASONS.get(reason)
    if meaning is None and reason.startswith(("QOS", "Assoc")):
        meaning = "a limit of its QoS or account holds it"
    return f"queued by Slurm: {reason}" + (f" ({meaning})" if meaning else "")


def parse_fields(line: str) -> dict[str, str]:
    """One ``scontrol -o show ...`` line as its ``Key=Value`` fields (a value runs to the
    next field; values with spaces, like ``Reason=``, keep them)."""
    fields: dict[str, str] = {}
    key: str | None = None
    for word in line.split(" "):
        name, sep, value = word.partition("=")
        if sep and name and name.replace("/", "").replace(":", "").isalnum():
            key = name
            fields[key] = value
        elif key is not None and word:
            fields[key] += " " + word
    return fields


def parse_records(output: str) -> list[dict[str, str]]:
    """Every non-empty line of ``scontrol -o show ...`` output, parsed."""
    return [parse_fields(line.strip()) for line in output.splitlines() if line.strip()]


def parse_squeue(output: str) -> dict[str, JobState]:
    """``squeue -h -o JOB_FIELDS`` output, by job id."""
    jobs: dict[str, JobState] = {}
    for line in output.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|")
        if len(parts) != 4 or not parts[0]:
            raise SlurmCommandError(f"slurm: squeue printed {line!r}, not "
                                    f"'{JOB_FIELDS}' fields")
        job_id, state, nodes, reason = parts
        jobs[job_id] = JobState(job_id, state, nodes, reason)
    return jobs


def parse_named_squeue(output: str) -> list[tuple[JobState, str, str]]:
    """``squeue -h -o NAMED_JOB_FIELDS`` output: each job with its name and comment (which
    runs to the end of the line, whatever it holds)."""
    jobs = []
    for line in output.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|", 5)
        if len(parts) != 6 or not parts[0]:
            raise SlurmCommandError(f"slurm: squeue printed {line!r}, not "
                                    f"'{NAMED_JOB_FIELDS}' fields")
        job_id, state, nodes, reason, name, comment = parts
        jobs.append((JobState(job_id, state, nodes, reason), name, comment))
    return jobs


def job_from_scontrol(fields: Mapping[str, str]) -> JobState:
    """A job as ``scontrol -o show job`` shows it (after it left ``squeue``)."""
    nodes = fields.get("NodeList", "")
    return JobState(fields["JobId"], fields.get("JobState", "UNKNOWN").split()[0],
                    "" if nodes == "(null)" else nodes, fields.get("Reason", "None"))


def parse_sbatch(output: str) -> str:
    """The job id ``sbatch --parsable`` printed (``ID`` or ``ID;CLUSTER``)."""
    job_id = output.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmCommandError(f"slurm: sbatch printed {output.strip()!r}, not a job id")
    return job_id


def minutes(value: str) -> int | None:
    """A Slurm time limit (``MM``, ``HH:MM:SS``, ``D-HH:MM:SS``, ``UNLIMITED``, ``NONE``) in
    whole minutes, rounded up; None when it sets no limit."""
    if value.upper() in {"UNLIMITED", "NONE", "INFINITE", ""}:
        return None
    days, dash, clock = value.rpartition("-")
    try:
        parts = [int(p) for p in clock.split(":")]
        if dash:  # D-HH, D-HH:MM, D-HH:MM:SS
            units = (3600, 60, 1)[:len(parts)]
            total_s = int(days) * 86400
        else:  # MM, MM:SS, HH:MM:SS
            units = {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}[len(parts)]
            total_s = 0
        total_s += sum(part * unit for part, unit in zip(parts, units, strict=True))
    except (ValueError, KeyError):
        raise SlurmCommandError(f"slurm: {value!r} is not a Slurm time limit") from None
    return -(-total_s // 60)
