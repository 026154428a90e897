"""The processes of a chaos scenario, found by scanning ``/proc`` (not by what the harness
started): every process whose environment carries the scenario's ``FLOW_HOME`` or the tag of
one of its simulated instances, or whose command line names its directory.

Each is given a role (agent, worker, keeper, sshd, instance, other) and its node's instance id,
so a fault can pick its victim: node N is the N-th of the task's sorted instance ids, as the
rendezvous ranks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SIM_TAG = "FLOW_SIM_INSTANCE"  # every process of a simulated instance: "<task id>/<instance id>"
LOCAL_TAG = "FLOW_INSTANCE_ID"  # every process of a local node: its instance id


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    cmdline: str
    instance: str | None  # the node's instance id, when the process belongs to a node
    slurm_node: str | None = None  # the Slurm node it runs on (a job's processes)
    session: int = 0  # its session id: a worker leads a session of its own

    @property
    def role(self) -> str:
        cmd = self.cmdline
        if "flow_sdk.node.agent.worker" in cmd:
            return "worker"
        if "flow_sdk.node.agent.forkserver" in cmd:  # the server, or a worker forked by it
            return "worker" if self.session == self.pid else "fork-server"
        if "flow_sdk.node.agent" in cmd:
            return "agent"
        if "flow_sdk.node.pool" in cmd:
            return "pool-daemon"
        if "_keeper.py" in cmd:
            return "keeper"
        if cmd.startswith("sshd") or "/sshd " in cmd or cmd.endswith("/sshd"):
            return "sshd"
        if "flow_sdk.sim._instance" in cmd:
            return "instance"
        return "other"

    def describe(self) -> str:
        return f"{self.pid} [{self.role}, {self.instance or '-'}, {self.state}] {self.cmdline[:160]}"


def _read(pid_dir: Path) -> tuple[bytes, str, bytes]:
    return ((pid_dir / "environ").read_bytes(), (pid_dir / "stat").read_text(),
            (pid_dir / "cmdline").read_bytes())


def _env_value(environ: list[bytes], key: str) -> str | None:
    prefix = f"{key}=".encode()
    for item in environ:
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def scan(home: Path, exclude: set[int]) -> list[Proc]:
    """Live processes (zombies excepted) of the scenario whose data directory is ``home``."""
    home_text = str(home)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            environ_raw, stat, cmd_raw = _read(entry)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        after = stat.rsplit(")", 1)[1].split()
        if after[0] in ("Z", "X"):
            continue
        environ = environ_raw.split(b"\0")
        cmdline = cmd_raw.replace(b"\0", b" ").decode(errors="replace").strip()
        flow_home = _env_value(environ, "FLOW_HOME") or ""
        sim_tag = _env_value(environ, SIM_TAG)
        ours = (flow_home == home_text or flow_home.startswith(home_text + "/")
                or home_text in cmdline or (sim_tag is not None and _sim_ours(home, sim_tag)))
        if not ours:
            continue
        instance = (sim_tag.split("/", 1)[1] if sim_tag and "/" in sim_tag
                    else _env_value(environ, LOCAL_TAG))
        found.append(Proc(int(entry.name), int(after[1]), after[0], cmdline, instance,
                          _env_value(environ, "SLURMD_NODENAME"), int(after[3])))
    return found


def _sim_ours(home: Path, tag: str) -> bool:
    """Whether the simulated instance ``tag`` was launched under ``home``'s simulated root."""
    task_id = tag.split("/", 1)[0]
    return (home / "sim-root" / "nodes" / task_id).is_dir()


def children_of(procs: list[Proc], pid: int) -> list[Proc]:
    return [p for p in procs if p.ppid == pid]


def by_role(procs: list[Proc], role: str) -> list[Proc]:
    return [p for p in procs if p.role == role]


def sshds(procs: list[Proc]) -> list[Proc]:
    """The nodes' sshd processes: the keepers' sshd children (they carry no flow variable)."""
    keepers = {p.pid for p in by_role(procs, "keeper")}
    return [p for p in procs if p.ppid in keepers and p.role == "sshd"]


def pool_workers(procs: list[Proc], node: int) -> list[Proc]:
    """A pool node's task workers: the daemon forks a warm interpreter, which forks them."""
    daemons = node_victims(procs, "pool-daemon", node)
    pids = {p.pid for p in daemons}
    return [p for p in daemons if p.ppid in pids and
            any(q.pid == p.ppid and q.ppid in pids for q in daemons)]


def instance_order(procs: list[Proc]) -> list[str]:
    """The instance ids seen, sorted (node N is the N-th)."""
    return sorted({p.instance for p in procs if p.instance})


def node_victims(procs: list[Proc], role: str, node: int) -> list[Proc]:
    """Processes of ``role`` on node ``node`` (the last node when there are fewer)."""
    heads = [p for p in procs if p.role in ("agent", "pool-daemon")]
    order = instance_order(heads or procs)
    if not order:
        return []
    instance = order[min(node, len(order) - 1)]
    return [p for p in procs if p.role == role and p.instance == instance]
