"""The coordination store a task's node agents share, hosted by the leader's agent.

Built on the stdlib ``kvstore`` (torch's TCPStore would make every agent import torch). Keys
live under a generation prefix so a re-rendezvous after a restart starts clean. The store carries the start barrier, heartbeats (counters, so clocks
need not agree), per-node completion flags and failure reports.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from flow_sdk.errors import RendezvousError
from flow_sdk.rendezvous.kvstore import KVClient, KVServer
from flow_sdk.rendezvous.membership import Membership


@dataclass(frozen=True)
class FailureReport:
    """What one node saw go wrong; the earliest root cause becomes the task's outcome."""

    node: int
    status: str  # "FAILED" | "TIMED_OUT"
    message: str
    observed_at: float
    rank: int | None = None
    exit_code: int | None = None
    signal_name: str | None = None
    log_tail: tuple[str, ...] = ()
    has_error_payload: bool = False
    lost: bool = False  # the node itself is gone (not just one of its workers)

    def root_cause_key(self) -> tuple[int, float]:
        # A worker killed by a signal or a lost node is never a consequence of a peer's failure;
        # a non-zero exit may be (a collective that broke because a peer died), so it ranks after.
        return (0 if self.status == "TIMED_OUT" or self.exit_code is None else 1, self.observed_at)


_GENERATION_KEY = "generation"


class StoreLost(RendezvousError):
    """The leader's store stopped answering: the leader node is gone or unreachable."""


class NodeStore:
    def __init__(self, client: KVClient, membership: Membership, server: KVServer | None = None,
                 generation: int = 0) -> None:
        self._store = client
        self._server = server
        self.m = membership
        self._prefix = f"g{generation}/"

    @classmethod
    def connect(cls, membership: Membership, port: int, timeout_s: float,
                generation: int = 0) -> NodeStore:
        """The leader hosts the store on its address; every node (leader too) connects.

        The store names its generation: a node that reaches the previous generation's store
        (its leader has not closed it yet) drops that connection and tries again.
        """
        server = None
        deadline = time.monotonic() + timeout_s
        try:
            if membership.is_leader:
                server = KVServer(membership.leader_address, port,
                                  initial={_GENERATION_KEY: str(generation)})
            port = server.port if server else port
            while True:
                client = None
                try:
                    client = KVClient(membership.leader_address, port,
                                      connect_timeout_s=max(0.1, deadline - time.monotonic()))
                    current = client.get(_GENERATION_KEY)
                except ConnectionError:  # the previous generation's store closing under us
                    current = None
                if client is not None and current == str(generation):
                    return cls(client, membership, server, generation)
                if client is not None:
                    client.close()
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"the store there serves generation {current}, "
                                       f"not {generation}")
                time.sleep(0.05)
        except OSError as exc:
            if server is not None:
                server.close()
            role = "host" if membership.is_leader else "reach"
            raise RendezvousError(f"could not {role} the rendezvous store at "
                                  f"{membership.leader_address}:{port} within {timeout_s:.0f}s: "
                                  f"{exc}") from exc

    def close(self) -> None:
        self._store.close()
        if self._server is not None:
            self._server.close()

    def _k(self, key: str) -> str:
        return self._prefix + key

    def _call(self, op: str, *args: Any) -> Any:
        try:
            return getattr(self._store, op)(*args)
        except OSError as exc:
            raise StoreLost(f"lost contact with the leader (node 0 at {self.m.leader_address}): "
                            f"{exc}") from exc

    def barrier(self, name: str, timeout_s: float, poll_s: float = 0.02) -> None:
        """Return when every node reached the barrier; raise naming the missing nodes."""
        self._call("set", self._k(f"{name}/{self.m.node_rank}"), "1")
        keys = [self._k(f"{name}/{r}") for r in range(self.m.num_nodes)]
        deadline = time.monotonic() + timeout_s
        while not self._call("check", keys):
            if time.monotonic() >= deadline:
                missing = [f"node {r} ({self.m.instance_ids[r]}, {self.m.addresses[r]})"
                           for r, key in enumerate(keys) if not self._call("check", [key])]
                raise RendezvousError(f"start barrier timed out after {timeout_s:.0f}s; "
                                      f"missing: {', '.join(missing)}")
            time.sleep(poll_s)

    def publish(self, name: str, value: str) -> None:
        """Set this node's value of ``name``."""
        self._call("set", self._k(f"{name}/{self.m.node_rank}"), value)

    def gather(self, name: str) -> list[str | None]:
        """Every node's value of ``name``, by node rank (None where unset)."""
        values: list[str | None] = self._call(
            "multi_get", [self._k(f"{name}/{r}") for r in range(self.m.num_nodes)])
        return values

    def heartbeat(self) -> None:
        self._call("add", self._k(f"hb/{self.m.node_rank}"), 1)

    def heartbeats(self) -> list[int]:
        """Every node's heartbeat counter, by node rank."""
        keys = [self._k(f"hb/{r}") for r in range(self.m.num_nodes)]
        return [int(v or 0) for v in self._call("multi_get", keys)]

    def mark_done(self) -> None:
        self._call("set", self._k(f"done/{self.m.node_rank}"), "1")

    def done_nodes(self) -> set[int]:
        return {r for r in range(self.m.num_nodes)
                if self._call("check", [self._k(f"done/{r}")])}

    def report_failure(self, report: FailureReport) -> None:
        """Record what this node saw and raise the failure flag every node watches."""
        self._call("set", self._k(f"fail/report/{report.node}"), json.dumps(asdict(report)))
        self._call("add", self._k("fail/count"), 1)

    def failed(self) -> bool:
        return bool(self._call("check", [self._k("fail/count")]))

    def failure_reports(self) -> list[FailureReport]:
        keys = [self._k(f"fail/report/{r}") for r in range(self.m.num_nodes)]
        reports = []
        for raw in self._call("multi_get", keys):
            if raw is not None:
                data = json.loads(raw)
                data["log_tail"] = tuple(data["log_tail"])
                reports.append(FailureReport(**data))
        return reports
