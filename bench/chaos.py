"""The chaos soak: seeded random faults on the local provider, the simulated cloud and Slurm.

    python bench/chaos.py --scenarios 500 --seed 0     # seeds 0..499
    python bench/chaos.py --replay 137                 # one scenario again, by its seed
    python bench/chaos.py --provider slurm --scenarios 100    # the slurm lane
    python bench/chaos.py --provider slurm --kind time-limit --scenarios 2

Each scenario (``_chaos_draw``) draws a provider, a job shape (1-4 nodes, 1-2 workers each,
``max_restarts`` 0-2, sometimes ``min_instances``) and one or two faults, each at a phase
(launch, boot, rendezvous, barrier, training, result upload, teardown). The harness runs the
job through a caller process of its own, strikes the faults from outside (``_chaos_inject``;
EC2 and S3 errors through a fault proxy in front of the simulated account, ``_chaos_proxy``),
and judges it (``_chaos_judge``): a terminal state within the scenario's bound, nothing left
(processes in /proc, the account's instances, security groups, key pairs, placement groups,
IAM roles, mounts, loop devices: ``_chaos_leaks``), logs readable up to the fault, and, when
the task succeeded, every rank's result equal to the fault-free computation's. A failing
scenario prints the command that replays it. Runs as root on Linux (the simulated cloud's
nodes and the small filesystems of the full-disk faults need it).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _chaos_draw import KINDS, LANES, Scenario, draw  # noqa: E402
from _chaos_run import Bench, Result, run_scenario  # noqa: E402


def replay_command(sc: Scenario, pinned: tuple[str | None, str | None]) -> str:
    kind, provider = pinned
    extra = (f" --kind {kind}" if kind else "") + (f" --provider {provider}" if provider else "")
    return f"python bench/chaos.py --replay {sc.seed}{extra}"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def table(results: list[Result]) -> str:
    """Scenarios per fault kind (a scenario counts under each of its kinds), p50/p99 time to
    the terminal state, hangs, leaks and lost results or logs."""
    by_kind: dict[str, list[Result]] = defaultdict(list)
    for result in results:
        for kind in dict.fromkeys(result.kinds):
            by_kind[kind].append(result)
    rows = ["| fault kind | scenarios | local | aws-sim | slurm | p50 to terminal (s) | "
            "p99 to terminal (s) | hangs | leaks | lost |", "|---|" + "---:|" * 9]
    for kind in sorted(by_kind):
        group = by_kind[kind]
        times = [r.terminal_s for r in group if r.status != "HUNG"]
        rows.append(f"| {kind} | {len(group)} | "
                    f"{sum(r.provider == 'local' for r in group)} | "
                    f"{sum(r.provider == 'aws-sim' for r in group)} | "
                    f"{sum(r.provider == 'slurm' for r in group)} | "
                    f"{percentile(times, 0.5):.2f} | {percentile(times, 0.99):.2f} | "
                    f"{sum(r.status == 'HUNG' for r in group)} | "
                    f"{sum(bool(r.leaks) for r in group)} | {sum(bool(r.lost) for r in group)} |")
    return "\n".join(rows)


def summary(results: list[Result]) -> str:
    statuses: dict[str, int] = defaultdict(int)
    for result in results:
        statuses[result.status.split(" ")[0]] += 1
    walls = [r.wall_s for r in results]
    return (f"{len(results)} scenarios: {sum(r.status == 'HUNG' for r in results)} hangs, "
            f"{sum(bool(r.leaks) for r in results)} with leaks, "
            f"{sum(bool(r.lost) for r in results)} with lost results or logs; terminal states "
            f"{dict(sorted(statuses.items()))}; wall p50 {statistics.median(walls or [0]):.1f} s")


def run(scenarios: list[Scenario], root: Path, out: Path | None,
        pinned: tuple[str | None, str | None]) -> list[Result]:
    results = []
    with Bench(root, sim=any(s.provider == "aws-sim" for s in scenarios),
               slurm=any(s.provider == "slurm" for s in scenarios)) as bench:
        for sc in scenarios:
            result = run_scenario(bench, sc)
            results.append(result)
            mark = "ok " if result.ok else "FAIL"
            print(f"{mark} {sc.describe()} -> {result.status} in {result.terminal_s:.2f}s "
                  f"(bound {result.bound_s:.0f}s, wall {result.wall_s:.1f}s)", flush=True)
            if not result.ok:
                for line in result.leaks + result.lost + result.notes:
                    print(f"     {line}", flush=True)
                print(f"     replay: {replay_command(sc, pinned)}", flush=True)
            if out is not None:
                with open(out, "a") as fh:
                    fh.write(result.to_json() + "\n")
    return results


def report(paths: list[Path]) -> int:
    """The table and summary of the results recorded in ``paths`` (one per seed: the last)."""
    by_seed: dict[int, Result] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                data = json.loads(line)
                by_seed[data["seed"]] = Result(**data)
    results = [by_seed[seed] for seed in sorted(by_seed)]
    print(table(results) + "\n\n" + summary(results))
    for result in results:
        if not result.ok:
            print(f"failed: {result.describe} -> {result.status}: "
                  f"{'; '.join(result.leaks + result.lost)[:300]}")
    return 0


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="the first scenario's seed")
    parser.add_argument("--replay", type=int, help="run the one scenario of this seed")
    parser.add_argument("--kind", choices=sorted(KINDS), help="pin the first fault's kind")
    parser.add_argument("--provider", choices=LANES, help="pin the provider (slurm: only "
                        "pinned; the bench starts a cluster of its own)")
    parser.add_argument("--out", type=Path, help="append every result as a JSON line here")
    parser.add_argument("--root", type=Path, help="where the scenarios run (default: a "
                        "temporary directory)")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSONL",
                        help="print the table of earlier runs' --out files (their union)")
    args = parser.parse_args(argv)
    if args.report:
        return report(args.report)
    signal.signal(signal.SIGTERM, _stop)  # unwinds: the account's server and proxy stop
    seeds = [args.replay] if args.replay is not None else \
        list(range(args.seed, args.seed + args.scenarios))
    scenarios = [draw(seed, args.kind, args.provider) for seed in seeds]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="flow-chaos-") as tmp:
        root = args.root or Path(tmp)
        results = run(scenarios, root, args.out, (args.kind, args.provider))
    print("\n" + table(results) + "\n")
    print(summary(results) + f"; whole run {time.monotonic() - started:.0f} s")
    failed = [r for r in results if not r.ok]
    for result in failed:
        print(f"failed: {result.describe} -> "
              f"{replay_command(draw(result.seed, args.kind, args.provider), (args.kind, args.provider))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
