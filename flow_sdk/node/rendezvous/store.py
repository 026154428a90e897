"""The coordination store a task's node agents share, hosted by the leader's agent.

Built on the stdlib ``kvstore`` (torch's TCPStore would make every agent import torch), which
admits only connections that hold the task's secret. Keys live under a generation prefix so a
re-rendezvous after a restart starts clean. The store carries the start barrier (a counter
the server answers blocking waits on), heartbeats (counters, so clocks need not agree),
per-node completion flags and failure reports (a counter each node watches with a blocking
wait on a second connection, so nothing polls). Every value read is validated: a malformed
one is skipped, never trusted.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from flow_sdk.errors import RendezvousError
from flow_sdk.node.rendezvous import kvwire
from flow_sdk.node.rendezvous.kvstore import KVClient, KVServer
from flow_sdk.node.rendezvous.membership import Membership
from flow_sdk.wire import safejson


@dataclass(frozen=True)
class FailureReport:
    """What one node saw go wrong; the earliest becomes the task's outcome, the rest its
    consequences. ``observed_at`` is when it happened, on the leader's clock (this node's
    clock corrected by its measured offset)."""

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
    label: str = "infra"  # one of LABELS: whose fault it was
    # This node's other failures after this one: (one-line summary, when, leader's clock).
    others: tuple[tuple[str, float], ...] = ()

    def root_cause_key(self) -> float:
        return self.observed_at

    def summary(self) -> str:
        """One line: where and what."""
        where = f"node {self.node}" + (f" rank {self.rank}" if self.rank is not None else "")
        first = self.message.splitlines()[0].split("; last lines:")[0] if self.message else ""
        return first if first.startswith(where) else f"{where}: {first}"


LABELS = ("user", "infra", "sdk")


_GENERATION_KEY = "generation"
_WATCH_CHUNK_S = 30.0  # one blocking wait of the failure watch
# One blocking wait at a barrier: the server answers it at the latest after this long, so a
# leader that stops answering (frozen, or its machine gone silent) is found within this plus
# the client's operation timeout (kvstore.OP_TIMEOUT_S): the heartbeat bound, not the barrier's.
BARRIER_WAIT_S = 1.0
_REPORT_TYPES: dict[str, tuple[type, ...]] = {
    "node": (int,), "status": (str,), "message": (str,), "observed_at": (int, float),
    "rank": (int, type(None)), "exit_code": (int, type(None)),
    "signal_name": (str, type(None)), "log_tail": (list,), "has_error_payload": (bool,),
    "lost": (bool,), "label": (str,), "others": (list,)}


def parse_report(raw: str, num_nodes: int) -> FailureReport | None:
    """A failure report read from the store, or None when it is malformed in any way."""
    try:
        data = safejson.loads(raw, max_bytes=kvwire.MAX_VALUE)
    except safejson.BadJson:
        return None
    names = {f.name for f in fields(FailureReport)}
    if not isinstance(data, dict) or set(data) != names:
        return None
    for name, kinds in _REPORT_TYPES.items():
        if not isinstance(data[name], kinds) or (bool in kinds) != isinstance(data[name], bool):
            return None
    if not (0 <= data["node"] < num_nodes and data["status"] in ("FAILED", "TIMED_OUT")
            and data["label"] in LABELS
            and all(isinstance(line, str) for line in data["log_tail"])
            and all(_is_other(o) for o in data["others"])):
        return None
    data["log_tail"] = tuple(data["log_tail"])
    data["others"] = tuple((str(text), float(at)) for text, at in data["others"])
    return FailureReport(**data)


def _is_other(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], (int, float)) and not isinstance(value[1], bool))


class StoreLost(RendezvousError):
    """The leader's store stopped answering: the leader node is gone or unreachable."""


class _FailureWatch:
    """A second connection that waits on the server for the failure counter to move."""

    def __init__(self, connect: Callable[[], KVClient], key: str) -> None:
        self.fired = threading.Event()
        self.error: OSError | None = None
        self._client = connect()
        self._key = key
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="failure-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._closed:
                if self._client.wait(self._key, 1, _WATCH_CHUNK_S) >= 1:
                    self.fired.set()
                    return
        except OSError as exc:
            if not self._closed:
                self.error = exc

    def close(self) -> None:
        self._closed = True
        self._client.close()
        self._thread.join(2.0)


class NodeStore:
    def __init__(self, client: KVClient, membership: Membership, server: KVServer | None = None,
                 generation: int = 0,
                 watch_client: Callable[[], KVClient] | None = None) -> None:
        self._store = client
        self._server = server
        self.m = membership
        self._prefix = f"g{generation}/"
        self._watch = (_FailureWatch(watch_client, self._k("fail/count"))
                       if watch_client is not None else None)

    @classmethod
    def connect(cls, membership: Membership, port: int, timeout_s: float, secret: bytes,
                generation: int = 0) -> NodeStore:
        """The leader hosts the store on its address; every node (leader too) connects.

        The store names its generation: a node that reaches the previous generation's store
        (its leader has not closed it yet) drops that connection and tries again.
        """
        server = None
        deadline = time.monotonic() + timeout_s
        try:
            if membership.is_leader:
                server = KVServer(membership.leader_address, port, secret,
                                  initial={_GENERATION_KEY: str(generation)})
            port = server.port if server else port

            def dial() -> KVClient:
                return KVClient(membership.leader_address, port, secret,
                                connect_timeout_s=max(0.1, deadline - time.monotonic()))

            while True:
                client = None
                try:
                    client = dial()
                    current = client.get(_GENERATION_KEY)
                except ConnectionError:  # the previous generation's store closing under us
                    current = None
                if client is not None and current == str(generation):
                    return cls(client, membership, server, generation, watch_client=dial)
                if client is not None:
                    client.close()
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"the store there serves generation {current}, "
                                       f"not {generation}")
                time.sleep(0.05)
        except OSError as exc:
            where = f"{membership.leader_address}:{port}"
            if membership.is_leader and server is None:  # the bind failed, at once
                raise RendezvousError(f"could not host the rendezvous store at {where}: "
                                      f"{exc}") from exc
            if server is not None:
                server.close()
            role = "host" if membership.is_leader else "reach"
            raise RendezvousError(f"could not {role} the rendezvous store at {where} within "
                                  f"{timeout_s:.0f}s: {exc}") from exc

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
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

    def barrier(self, name: str, timeout_s: float) -> None:
        """Return when every node reached the barrier; raise naming the missing nodes. The
        server answers the wait when the last node arrives (nothing polls), or after
        ``BARRIER_WAIT_S``, when the wait is asked again: a leader that does not answer
        raises ``StoreLost`` within that plus the operation timeout."""
        self._call("set", self._k(f"{name}/{self.m.node_rank}"), "1")
        counter = self._k(f"{name}/count")
        arrived = self._call("add", counter, 1)
        deadline = time.monotonic() + timeout_s
        while arrived < self.m.num_nodes:
            left = deadline - time.monotonic()
            if left <= 0:
                values = self._call("multi_get", [self._k(f"{name}/{r}")
                                                  for r in range(self.m.num_nodes)])
                missing = [f"node {r} ({self.m.instance_ids[r]}, {self.m.addresses[r]})"
                           for r, value in enumerate(values) if value is None]
                raise RendezvousError(f"start barrier timed out after {timeout_s:.0f}s; "
                                      f"missing: {', '.join(missing)}")
            arrived = self._call("wait", counter, self.m.num_nodes, min(left, BARRIER_WAIT_S))

    def publish(self, name: str, value: str) -> None:
        """Set this node's value of ``name``."""
        self._call("set", self._k(f"{name}/{self.m.node_rank}"), value)

    def gather(self, name: str) -> list[str | None]:
        """Every node's value of ``name``, by node rank (None where unset)."""
        values: list[str | None] = self._call(
            "multi_get", [self._k(f"{name}/{r}") for r in range(self.m.num_nodes)])
        return values

    def clock_offset(self, samples: int = 5) -> float:
        """Seconds to add to this node's clock to read the leader's: from the exchange with
        the shortest round trip (its error is at most half that round trip)."""
        best: tuple[float, float] | None = None
        for _ in range(samples):
            sent = time.time()
            leader = self._store.server_time()
            back = time.time()
            if best is None or back - sent < best[0]:
                best = (back - sent, leader - (sent + back) / 2)
        assert best is not None
        return best[1]

    def heartbeat(self) -> None:
        self._call("add", self._k(f"hb/{self.m.node_rank}"), 1)

    def heartbeats(self) -> list[int]:
        """Every node's heartbeat counter, by node rank (0 where unset or malformed)."""
        keys = [self._k(f"hb/{r}") for r in range(self.m.num_nodes)]
        return [kvwire.as_count(v) or 0 for v in self._call("multi_get", keys)]

    def mark_done(self) -> None:
        self._call("set", self._k(f"done/{self.m.node_rank}"), "1")

    def done_nodes(self) -> set[int]:
        values = self._call("multi_get", [self._k(f"done/{r}") for r in range(self.m.num_nodes)])
        return {r for r, value in enumerate(values) if value == "1"}

    def report_failure(self, report: FailureReport) -> None:
        """Record what this node saw and raise the failure flag every node watches."""
        self._call("set", self._k(f"fail/report/{report.node}"), json.dumps(asdict(report)))
        self._call("add", self._k("fail/count"), 1)

    def failed(self) -> bool:
        """Whether a node reported a failure (answered by the watch: no request)."""
        if self._watch is None:
            return bool(self._call("check", [self._k("fail/count")]))
        if self._watch.fired.is_set():
            return True
        if self._watch.error is not None:
            raise StoreLost(f"lost contact with the leader (node 0 at {self.m.leader_address}): "
                            f"{self._watch.error}")
        return False

    def failure_reports(self) -> list[FailureReport]:
        """Every well-formed report, by node; a malformed one is skipped."""
        keys = [self._k(f"fail/report/{r}") for r in range(self.m.num_nodes)]
        reports = []
        for raw in self._call("multi_get", keys):
            report = parse_report(raw, self.m.num_nodes) if raw is not None else None
            if report is not None:
                reports.append(report)
        return reports
