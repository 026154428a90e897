"""``flow doctor TASK``: can every node of a running task reach the others?

Over SSH (host keys pinned), each node opens TCP connections to every other node's SSH port
at its private address and to the leader's rendezvous port, and reports what it could not
reach. The same question ``preflight=True`` answers before user code starts, asked of a task
that is already running.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from flow_sdk.errors import SshError
from flow_sdk.client.task import Task

_PROBE = """
import json, socket, sys
failures = []
for node, host, port, what in json.loads(sys.argv[1]):
    try:
        socket.create_connection((host, port), timeout=float(sys.argv[2])).close()
    except OSError as exc:
        failures.append(f"node {node}'s {what} at {host}:{port} ({exc.strerror or exc})")
print(json.dumps(failures))
"""


@dataclass(frozen=True)
class NodeCheck:
    node: int
    address: str
    failures: tuple[str, ...]  # what this node could not reach; empty when all is well
    error: str | None = None  # the node itself could not be checked (no SSH, ...)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.failures


def check_task(task: Task, timeout_s: float = 3.0) -> list[NodeCheck]:
    """One ``NodeCheck`` per node of the running task, by node rank."""
    nodes = sorted(task.nodes(), key=lambda n: n.node)
    record = task.record()
    ports: dict[int, int] = {}
    checks: dict[int, NodeCheck] = {}
    for n in nodes:
        try:
            ports[n.node] = task.ssh_endpoint(n.node).port
        except SshError as exc:
            checks[n.node] = NodeCheck(n.node, n.address, (), f"cannot be checked: {exc}")
    leader = next((n for n in nodes if n.node == 0), None)
    for n in nodes:
        if n.node in checks:
            continue
        targets = [(o.node, o.address, ports[o.node], "SSH port") for o in nodes
                   if o.node != n.node and o.node in ports]
        if leader is not None and n.node != 0:
            targets.append((0, leader.address, record.rdzv_port, "rendezvous port"))
        command = (f"python3 -c {shlex.quote(_PROBE)} {shlex.quote(json.dumps(targets))} "
                   f"{timeout_s}")
        try:
            result = task.ssh(n.node, command=command, timeout=timeout_s * len(targets) + 30)
        except SshError as exc:
            checks[n.node] = NodeCheck(n.node, n.address, (), f"cannot be checked: {exc}")
            continue
        if result.exit_code != 0:
            checks[n.node] = NodeCheck(n.node, n.address, (), "the probe failed on the node "
                                       f"(exit {result.exit_code}): {result.stderr.strip()}")
            continue
        checks[n.node] = NodeCheck(n.node, n.address, tuple(json.loads(result.stdout)))
    return [checks[n.node] for n in nodes]
