"""The leader's rendezvous store at gang scale: today's store against the old one, in one run.

    python bench/rendezvous.py [--clients 1024] [--procs 8] [--heartbeat-s 5] [--timeout-s 30]

For each store, ``--clients`` store clients (threads spread over ``--procs`` processes, on
loopback) each connect as one node would, then:

1. Barrier: all arrive at the start barrier at the same instant. Reported: the time from the
   last arrival to the last release, and how many nodes timed out (``--timeout-s``) or could
   not connect.
2. Heartbeats: every node sends its heartbeat every 0.25 s (the agent's watch interval) for
   ``--heartbeat-s`` seconds, with what else the agent sends each tick. Reported: p50 / p99
   latency of the heartbeat operation.

"old" is a faithful copy of the store before it was rebuilt (``bench/_kvstore_baseline.py``:
a thread per connection, listen backlog 5, the barrier polled every 20 ms, the failure flag
checked every tick). "new" is ``flow_sdk.node.rendezvous`` as the agents use it: an event loop,
backlog 4096, authenticated connections, a barrier and a failure watch that block on the server.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _kvstore_baseline import OldKVClient, OldKVServer, old_barrier, old_watch_tick  # noqa: E402

from flow_sdk.errors import FlowError  # noqa: E402
from flow_sdk.node.rendezvous.kvstore import KVClient, KVServer  # noqa: E402
from flow_sdk.node.rendezvous.membership import Membership  # noqa: E402
from flow_sdk.node.rendezvous.store import NodeStore  # noqa: E402

HOST = "127.0.0.1"
TICK_S = 0.25
SECRET = bytes(range(32))  # the same in every process of the bench (spawned, not forked)


@dataclass
class NodeResult:
    connected: bool = False
    arrived: float | None = None  # epoch seconds when its arrival was acknowledged
    released: float | None = None
    timed_out: bool = False
    latencies: list[float] = field(default_factory=list)


class _Node:
    """One simulated node: a connection (two for the new store: the failure watch)."""

    def __init__(self, design: str, port: int, rank: int, members: Membership,
                 timeout_s: float) -> None:
        self.design, self.rank, self.timeout_s = design, rank, timeout_s
        self.num_nodes = members.num_nodes
        if design == "old":
            self.old = OldKVClient(HOST, port, connect_timeout_s=timeout_s)
        else:
            m = Membership(rank, members.num_nodes, HOST, members.instance_ids, members.addresses)

            def dial() -> KVClient:
                return KVClient(HOST, port, SECRET, connect_timeout_s=timeout_s)

            self.new = NodeStore(dial(), m, watch_client=dial)

    def barrier(self, result: NodeResult) -> None:
        if self.design == "old":
            self.old.set(f"g0/arrived/{self.rank}", "1")
            result.arrived = time.time()
            old_barrier(self.old, self.rank, self.num_nodes, self.timeout_s)
        else:
            self.new.publish("arrived", "1")
            result.arrived = time.time()
            self.new.barrier("start", self.timeout_s)
        result.released = time.time()

    def heartbeat(self, result: NodeResult) -> None:
        started = time.perf_counter()
        if self.design == "old":
            self.old.add(f"g0/hb/{self.rank}", 1)
            result.latencies.append(time.perf_counter() - started)
            old_watch_tick(self.old, self.rank)
        else:
            self.new.heartbeat()
            result.latencies.append(time.perf_counter() - started)
            self.new.failed()  # answered by the failure watch: no request

    def close(self) -> None:
        if self.design == "old":
            self.old.close()
        else:
            self.new.close()


def _run_node(design: str, port: int, rank: int, members: Membership, args: argparse.Namespace,
              result: NodeResult, phases: dict[str, Any]) -> None:
    node = None
    try:
        node = _Node(design, port, rank, members, args.timeout_s)
        result.connected = True
    except (OSError, FlowError) as exc:
        result.timed_out = True
        print(f"  {design} node {rank} did not connect: {exc!r}", file=sys.stderr)
    if node is None:
        return
    phases["go"].wait()
    time.sleep(max(0.0, phases["start_at"].value - time.time()))
    try:
        node.barrier(result)
    except (OSError, TimeoutError) as exc:
        result.timed_out = True
        if rank % 256 == 0:
            print(f"  {design} node {rank}: {exc!r}", file=sys.stderr)
    phases["beat"].wait()
    end = phases["beat_at"].value + args.heartbeat_s
    next_at = phases["beat_at"].value + random.random() * TICK_S
    try:
        while next_at < end:
            time.sleep(max(0.0, next_at - time.time()))
            node.heartbeat(result)
            next_at += TICK_S
    except OSError:
        result.timed_out = True
    phases["close"].wait()  # nobody tears down while others still beat
    node.close()


def _process(design: str, port: int, ranks: list[int], num_nodes: int,
             args: argparse.Namespace, events: dict[str, Any], out: Any) -> None:
    ids = tuple(f"i-{r:05d}" for r in range(num_nodes))
    members = Membership(0, num_nodes, HOST, ids, (HOST,) * num_nodes)
    results = [NodeResult() for _ in ranks]
    threads = [threading.Thread(target=_run_node, args=(design, port, r, members, args, res,
                                                        events), daemon=True)
               for r, res in zip(ranks, results)]
    for t in threads:
        t.start()
    events["ready"].put(1)  # threads started; each connects, then waits for the go
    for t in threads:
        t.join()
    out.put([(r.connected, r.arrived, r.released, r.timed_out, r.latencies) for r in results])


def run(design: str, args: argparse.Namespace) -> dict[str, float]:
    server: Any = OldKVServer(HOST, 0) if design == "old" else KVServer(HOST, 0, SECRET)
    ctx = mp.get_context("spawn")  # the server's thread and sockets stay in this process
    events = {"go": ctx.Event(), "beat": ctx.Event(), "close": ctx.Event(),
              "ready": ctx.Queue(),
              "start_at": ctx.Value("d", 0.0), "beat_at": ctx.Value("d", 0.0)}
    out = ctx.Queue()
    n = args.clients
    chunks = [list(range(p, n, args.procs)) for p in range(args.procs)]
    procs = [ctx.Process(target=_process, args=(design, server.port, chunk, n, args, events, out))
             for chunk in chunks]
    started = time.monotonic()
    for p in procs:
        p.start()
    for _ in procs:
        events["ready"].get()
    time.sleep(min(args.timeout_s, 2.0 + n / 200))  # let every node connect first
    events["start_at"].value = time.time() + 0.5
    events["go"].set()
    time.sleep(0.5 + min(args.timeout_s, 3.0 if design == "new" else args.timeout_s) + 0.5)
    events["beat_at"].value = time.time() + 0.2
    events["beat"].set()
    time.sleep(0.2 + args.heartbeat_s + 1.0)
    events["close"].set()
    rows = [row for _ in procs for row in out.get()]
    for p in procs:
        p.join()
    server.close()
    arrivals = [r[1] for r in rows if r[1] is not None]
    releases = [r[2] for r in rows if r[2] is not None]
    latencies = sorted(x for r in rows for x in r[4])
    return {
        "connected": sum(r[0] for r in rows),
        "timeouts": sum(r[3] for r in rows),
        "released": len(releases),
        "release_s": (max(releases) - max(arrivals)) if releases and arrivals else float("nan"),
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan"),
        "beats": len(latencies),
        "wall_s": time.monotonic() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=1024)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--heartbeat-s", type=float, default=5.0)
    parser.add_argument("--timeout-s", type=float, default=30.0)
    args = parser.parse_args()
    results = {}
    for design in ("new", "old"):
        print(f"running the {design} store with {args.clients} clients...", file=sys.stderr)
        results[design] = run(design, args)
    new, old = results["new"], results["old"]
    print(f"\n{args.clients} store clients over {args.procs} processes on loopback "
          f"(barrier timeout {args.timeout_s:.0f}s, heartbeats every {TICK_S}s for "
          f"{args.heartbeat_s:.0f}s)\n")
    print("| store | connected | released | timed out | last arrival -> last release (s) "
          "| heartbeat p50 (ms) | heartbeat p99 (ms) | heartbeats |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in (("old (thread per connection, 20 ms polling)", old),
                    ("new (event loop, server-side waits, authenticated)", new)):
        release = f"{r['release_s']:.3f}" if r["released"] else "none released"
        print(f"| {name} | {r['connected']} | {r['released']} | {r['timeouts']} "
              f"| {release} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['beats']} |")

    def ratio(key: str) -> str:
        if old["released"] == 0 and key == "release_s":
            return "old: none released"
        return f"{old[key] / new[key]:.1f}x" if new[key] > 0 else "n/a"

    print(f"| old / new | | | | {ratio('release_s')} | {ratio('p50_ms')} | {ratio('p99_ms')} "
          "| |")


if __name__ == "__main__":
    main()
