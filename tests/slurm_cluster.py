"""A real Slurm cluster on this machine, for the tests and the benches.

``SlurmCluster.start(root, ...)`` writes a munge key and a ``slurm.conf`` into ``root`` and
starts ``munged``, one ``slurmctld`` and one ``slurmd -N NAME`` per node (Debian's Slurm
build allows several on one host). Each node has its own loopback ``NodeAddr`` and port, as
nodes of a real cluster have their own addresses; the controller and the nodes use
``proctrack/linuxproc`` and ``task/none`` (no cgroups needed), ``select/cons_tres`` and no
accounting database, so ``sacct`` does not work here, as on many real clusters. It returns
once ``sinfo`` shows every node idle, and ``stop()`` ends every process it started (and any
job step left behind) by PID.

Commands reach the cluster through ``SLURM_CONF`` (``cluster.env``); ``cluster.run(...)``
runs one with it. Nothing here is part of the SDK: it plays the site's administrators.
"""

from __future__ import annotations

import getpass
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flow_sdk.system import procs

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "sinfo",
           "scancel")
MARKER = "FLOW_TEST_SLURM_CLUSTER"  # in every daemon's environment (and so its job steps')
_UP_TIMEOUT_S = 60.0
_QUEUE_GRACE_S = 10.0  # for the queue to empty once every job is cancelled
# for the daemons to end after SIGTERM: they take a tenth of a second, but the slurmd of a node
# set down while a job step ran there took 10 s (MessageTimeout), its step still running
_DAEMON_GRACE_S = 3.0


GPU_TYPE = "h100"  # the GRES type of a cluster started with gpus=
NVIDIA_MAJOR = 195  # the device major of /dev/nvidia*: no driver here, so they open nothing


class SlurmMissing(RuntimeError):
    """Slurm's or munge's programs are not installed here."""


@dataclass(frozen=True)
class SlurmNode:
    name: str
    address: str  # its NodeAddr, on loopback
    port: int  # its slurmd's port


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    nodes: tuple[SlurmNode, ...]
    partition: str
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # by daemon

    @property
    def pids(self) -> dict[str, int]:
        return {name: child.pid for name, child in self.children.items()}

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` naming this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 30, check: bool = True,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False, cwd=cwd or self.root)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: "
                               f"{done.stderr.strip() or done.stdout.strip()}")
        return done

    def node_states(self) -> dict[str, str]:
        """Each node's state, as ``sinfo`` shows it (``idle``, ``alloc``, ``down*`` ...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def jobs_left(self, within_s: float = 15.0) -> str:
        """This user's jobs still in ``squeue`` (one line each) once ``within_s`` has passed
        or the queue is empty: a job that ended may be ``COMPLETING`` for a moment."""
        deadline = time.monotonic() + within_s
        while True:
            left = self.run("squeue", "-h", "-u", getpass.getuser(), "-o", "%i %j %T").stdout
            if not left.strip() or time.monotonic() > deadline:
                return left.strip()
            time.sleep(0.2)

    def job_processes(self, job_id: str, node: str | None = None) -> list[int]:
        """The PIDs of job ``job_id``'s processes (on node ``node`` when given): its batch
        script, steps, agents and workers. Job ids repeat across the clusters of runners
        working at once, so the process's ``SLURM_CONF`` must name this one."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                env = dict(part.split("=", 1) for part in (entry / "environ").read_bytes(
                    ).decode(errors="replace").split("\0") if "=" in part)
            except OSError:
                continue
            if (env.get("SLURM_JOB_ID"), env.get("SLURM_CONF")) == (job_id, str(self.conf)) and (
                    node is None or env.get("SLURMD_NODENAME") == node):
                found.append(int(entry.name))
        return found

    def logs(self) -> str:
        """The tail of every daemon's log, for a failure message."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            lines = path.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    # -- start and stop ----------------------------------------------------------------------

    @classmethod
    def start(cls, root: Path, nodes: int = 3, cpus: int = 2, subnet: int = 60,
              partition: str = "debug", max_time_min: int | None = 60,
              default_time_min: int | None = None, extra_conf: Sequence[str] = (),
              gpus: int = 0) -> SlurmCluster:
        """Start a cluster of ``nodes`` nodes with ``cpus`` CPUs each; node ``k`` listens on
        ``127.<subnet>.0.<k+1>``. Give each cluster running at once its own ``subnet``.
        ``gpus``: each node declares that many GPUs of GRES type ``GPU_TYPE``, backed by
        stand-in device files (Slurm hands them out and sets ``CUDA_VISIBLE_DEVICES``)."""
        missing = [name for name in DAEMONS if shutil.which(name) is None
                   and not Path("/usr/sbin", name).exists()]
        if missing:
            raise SlurmMissing(f"Slurm's programs {missing} are not installed: run "
                               "`bash scripts/setup.sh --dev` (it installs slurmctld, slurmd, "
                               "slurm-client and munge with apt-get)")
        root.mkdir(parents=True, exist_ok=True)
        for folder in ("munge", "state", "spool", "log"):
            (root / folder).mkdir(exist_ok=True)
        key = root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        (root / "munge").chmod(0o700)
        socket_path = root / "munge-run" / "munge.socket"
        socket_path.parent.mkdir(exist_ok=True)
        socket_path.parent.chmod(0o755)  # munge clients of every user reach it
        members = tuple(SlurmNode(f"n{k + 1}", f"127.{subnet}.0.{k + 1}",
                                  procs.free_port(f"127.{subnet}.0.{k + 1}"))
                        for k in range(nodes))
        conf = root / "slurm.conf"
        conf.write_text(_config(root, socket_path, members, cpus, partition, max_time_min,
                                default_time_min, extra_conf, gpus))
        if gpus:
            (root / "gpus").mkdir(exist_ok=True)
            for k in range(gpus):  # character devices, as Slurm requires: NVIDIA's major
                os.mknod(root / "gpus" / f"nvidia{k}", stat.S_IFCHR | 0o600,
                         os.makedev(NVIDIA_MAJOR, k))
            (root / "gres.conf").write_text(f"AutoDetect=off\nName=gpu Type={GPU_TYPE} "
                                            f"File={root / 'gpus'}/nvidia[0-{gpus - 1}]\n")
        cluster = cls(root, conf, members, partition)
        try:
            cluster._spawn("munged", ["munged", "-F", "-f", f"--key-file={key}",
                                      f"--socket={socket_path}",
                                      f"--pid-file={root / 'munge' / 'munged.pid'}",
                                      f"--seed-file={root / 'munge' / 'seed'}",
                                      f"--log-file={root / 'log' / 'munged.log'}"])
            _wait_for(lambda: socket_path.exists(), 10, "munged's socket", cluster)
            cluster._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)])
            for node in members:
                (root / "spool" / node.name).mkdir(exist_ok=True)
                cluster._spawn(f"slurmd-{node.name}",
                               ["slurmd", "-D", "-f", str(conf), "-N", node.name])
            _wait_for(lambda: cluster._all_idle(), _UP_TIMEOUT_S, "every node idle", cluster)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def revive(self) -> None:
        """Every node back after a fault: a killed ``slurmd`` started again, a node set down
        resumed; returns once every node is idle."""
        for node in self.nodes:
            name = f"slurmd-{node.name}"
            if self.children[name].poll() is not None:
                self._spawn(name, ["slurmd", "-D", "-f", str(self.conf), "-N", node.name])
        for name, state in self.node_states().items():
            if state.startswith(("down", "drain", "fail")):
                self.run("scontrol", "update", f"nodename={name}", "state=resume", check=False)
        _wait_for(lambda: self._all_idle(), _UP_TIMEOUT_S, "every node idle again", self)

    def stop(self) -> None:
        """Cancel every job, then end the daemons and whatever they left, by PID."""
        controller = self.children.get("slurmctld")
        if controller is not None and controller.poll() is None:
            self._cancel_every_job()
        order = [name for name in self.children if name.startswith("slurmd-")]
        order += [name for name in ("slurmctld", "munged") if name in self.children]
        for name in order:
            if self.children[name].poll() is None:
                self.children[name].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _DAEMON_GRACE_S
        for name in order:
            child = self.children[name]
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(5)
        # A job step's slurmstepd clears its environment, and one whose slurmd is gone lingers:
        # it still holds its node's log file, under this cluster's root.
        leftovers = set(procs.pids_with_env(MARKER, [str(self.root)])) | holders(self.root)
        procs.stop_pids(sorted(leftovers), grace_s=2.0)

    def _cancel_every_job(self) -> None:
        """Cancel this user's jobs and wait (a while) until the queue has none, so each job's
        steps end while their slurmd is still there to see them end."""
        user = getpass.getuser()
        self.run("scancel", "--full", "-u", user, check=False, timeout=10)
        deadline = time.monotonic() + _QUEUE_GRACE_S
        while time.monotonic() < deadline:
            left = self.run("squeue", "-h", "-u", user, check=False, timeout=10)
            if left.returncode != 0 or not left.stdout.strip():
                return
            time.sleep(0.2)

    def _spawn(self, name: str, argv: list[str]) -> None:
        env = {key: value for key, value in os.environ.items()  # not the test's FLOW_HOME:
               if not key.startswith("FLOW_")}  # the cluster outlives the test that starts it
        env.update({MARKER: str(self.root), "SLURM_CONF": str(self.conf)})
        with open(self.root / "log" / f"{name}.out", "ab") as out:
            child = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.children[name] = child

    def _all_idle(self) -> bool:
        try:
            states = self.node_states()
        except RuntimeError:
            return False  # the controller is not answering yet
        return len(states) == len(self.nodes) and all(s == "idle" for s in states.values())


def runner_subnet(offset: int = 0) -> int:
    """A loopback ``127.<subnet>.0.0/16`` of this test runner's own, so that the clusters of
    runners working at once never share an address."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return 60 + offset + int(worker.removeprefix("gw") or 0)


def holders(root: Path) -> set[int]:
    """PIDs of processes (not this one) with a file under ``root`` open (Linux ``/proc``)."""
    found: set[int] = set()
    prefix = f"{root}/"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            targets = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:  # gone, or not ours to read
            continue
        if any(target.startswith(prefix) for target in targets):
            found.add(int(entry.name))
    return found


def _wait_for(ready: Callable[[], bool], timeout_s: float, what: str,
              cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        for name, child in cluster.children.items():
            if child.poll() is not None:
                raise RuntimeError(f"{name} exited {child.returncode} while waiting for "
                                   f"{what}:\n{cluster.logs()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {timeout_s:.0f}s:\n{cluster.logs()}")
        time.sleep(0.2)


def _config(root: Path, munge_socket: Path, nodes: Sequence[SlurmNode], cpus: int,
            partition: str, max_time_min: int | None, default_time_min: int | None,
            extra: Sequence[str], gpus: int = 0) -> str:
    user = getpass.getuser()
    host = socket.gethostname().split(".")[0]
    ctld_port = procs.free_port()
    limits = ""
    if max_time_min is not None:
        limits += f" MaxTime={max_time_min}"
    if default_time_min is not None:
        limits += f" DefaultTime={default_time_min}"
    lines = [
        "ClusterName=flowtest",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"SlurmUser={user}", f"SlurmdUser={user}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'spool'}/%n/slurmd.pid",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log'}/slurmd.%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill", "MpiDefault=none", "MailProg=/bin/true",
        # as at most sites: a node that stopped answering returns when its slurmd is back,
        # one an administrator set down stays down until resumed
        "ReturnToService=1", "SlurmdTimeout=10", "InactiveLimit=0", "KillWait=5",
        "MessageTimeout=10", "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        *extra,
    ]
    gres = ""
    if gpus:
        lines.append("GresTypes=gpu")
        gres = f" Gres=gpu:{GPU_TYPE}:{gpus}"
    for node in nodes:
        lines.append(f"NodeName={node.name} NodeHostname={host} NodeAddr={node.address} "
                     f"Port={node.port} CPUs={cpus} RealMemory=1000{gres} State=UNKNOWN")
    lines.append(f"PartitionName={partition} Nodes=ALL Default=YES{limits} State=UP")
    return "\n".join(lines) + "\n"

