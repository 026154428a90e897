"""Where a task's launch time goes: per-phase seconds per node, at 2 and at 16 nodes.

    python bench/timeline.py [--nodes 2 16] [--repeats 1] [--provider aws-sim]

Each round runs a trivial task (every node returns its rank) on the simulated cloud
(``aws-sim``, default settings: each instance runs the real user-data), waits for its result,
and reads its timeline (``flow_sdk.client.timeline``). The table gives, per phase, the median
over the nodes (and rounds) of each node's seconds since its previous phase, one column per
node count, side by side, plus the median of each node's request-to-end time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

from flow_sdk import FlowApp
from flow_sdk.client.timeline import Timeline, phase_durations, render, task_timeline
from flow_sdk.sim import stop_account
from flow_sdk.wire.timeline import phase_order

SETTLE_S = 5.0  # between rounds: what the last one tore down stops first
TOTAL = "total (request to end)"


def _rank() -> int:
    print("started", flush=True)  # the first worker line
    return int(os.environ.get("RANK", "0"))


def run_round(app: FlowApp, nodes: int) -> Timeline:
    """One task of ``nodes`` nodes, to its end; its timeline."""
    fn = app.function(num_instances=nodes, quiet=True)(_rank)
    task = fn.spawn()
    ranks = task.results(timeout=900)
    assert sorted(ranks) == list(range(nodes)), ranks
    return task_timeline(task)


def figures(timelines: Sequence[Timeline]) -> dict[str, list[float]]:
    """Per phase, every node's seconds since its previous phase over ``timelines``; and the
    nodes' request-to-end seconds under ``TOTAL``."""
    found: dict[str, list[float]] = {}
    for timeline in timelines:
        for phase, seconds in phase_durations(timeline).items():
            found.setdefault(phase, []).extend(seconds)
        found.setdefault(TOTAL, []).extend(
            n.phases["end"] - timeline.requested_at for n in timeline.nodes
            if "end" in n.phases)
    return found


def table(by_count: dict[int, dict[str, list[float]]]) -> str:
    """Markdown: one row per phase, one column per node count, median seconds per node."""
    counts = sorted(by_count)
    phases = sorted({p for f in by_count.values() for p in f if p != TOTAL}, key=phase_order)
    lines = ["| phase (median s per node) | " + " | ".join(f"{c} nodes" for c in counts) + " |",
             "|---|" + "---:|" * len(counts)]
    for phase in [*phases, TOTAL]:
        cells = [by_count[c].get(phase, []) for c in counts]
        lines.append(f"| {phase} | " + " | ".join(
            f"{statistics.median(v):.2f}" if v else "-" for v in cells) + " |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 16],
                        help="node counts, one column each (default: 2 16)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds per node count")
    parser.add_argument("--provider", default="aws-sim",
                        help="aws-sim (default), or local for a quick look")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.nodes) or args.repeats < 1:
        parser.error("--nodes and --repeats must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("FLOW_HOME", tempfile.mkdtemp(prefix="flow-bench-"))
    app = FlowApp("bench-timeline", provider=args.provider)
    by_count: dict[int, dict[str, list[float]]] = {}
    try:
        for count in args.nodes:
            rounds = []
            for _ in range(args.repeats):
                rounds.append(run_round(app, count))
                time.sleep(SETTLE_S if args.provider == "aws-sim" else 0.0)
            by_count[count] = figures(rounds)
            if count == min(args.nodes):
                print(render(rounds[-1]), flush=True)  # what `flow timeline` draws
    finally:
        if args.provider == "aws-sim":
            stopped = stop_account()
            print(f"stopped the simulated account (server pid {stopped})", file=sys.stderr)
    print(f"{args.provider}, {args.repeats} round(s) per node count")
    print(table(by_count))


if __name__ == "__main__":
    main()
