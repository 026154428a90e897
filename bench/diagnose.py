"""The earliest failure, named: over seeded runs, is the rank ``.remote()`` blames the rank that
failed first?

    python bench/diagnose.py [--runs 50] [--seed 0]

Each run is a real gloo gang of 4 ranks (2 local nodes x 2 workers) doing all-reduces. The seed
draws the failing rank, after how many all-reduces it fails, and how:

- ``raises``: a ``ValueError`` in user code;
- ``connection``: a ``ConnectionResetError`` in user code (its own connection broke), after
  which its process exits and its sockets close: the first failure is itself a connection
  error, like the consequences it causes, so ordering by exception type cannot pass;
- ``exits``: ``os._exit(1)`` with no exception and no word (timed by the agent).

Every other rank then fails with gloo's connection error. The run is right when the error
``.remote()`` raises names the drawn rank. Prints one line per run and the tally.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import tempfile
import time

from flow_sdk import FlowApp, TaskFailedError

KINDS = ("raises", "connection", "exits")


def _gang(failing: int, kind: str, steps: int) -> None:
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.ones(1)
    for _ in range(steps):
        dist.all_reduce(value)
    if dist.get_rank() == failing:
        if kind == "raises":
            raise ValueError(f"rank {failing} failed first")
        if kind == "connection":
            raise ConnectionResetError(f"rank {failing}: connection reset by peer")
        os._exit(1)
    for _ in range(1000):
        dist.all_reduce(value)  # the peer is gone: gloo raises a connection error


def blamed_rank(exc: BaseException) -> int | None:
    """The rank the raised error names."""
    if isinstance(exc, TaskFailedError):
        return exc.rank
    for note in getattr(exc, "__notes__", []):
        match = re.search(r"raised on node \d+, rank (\d+)", note)
        if match:
            return int(match[1])
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("FLOW_HOME", tempfile.mkdtemp(prefix="flow-bench-diagnose-"))
    app = FlowApp("bench-diagnose")
    fn = app.function(num_instances=2, workers_per_node=2, quiet=True)(_gang)
    draws = random.Random(args.seed)
    right, seconds, kinds = 0, [], {k: [0, 0] for k in KINDS}
    for run in range(args.runs):
        failing, kind, steps = draws.randrange(4), draws.choice(KINDS), draws.randrange(1, 20)
        started = time.monotonic()
        try:
            fn.remote(failing, kind, steps)
            blamed: int | None = None
        except Exception as exc:  # the task's error, whatever its type
            blamed = blamed_rank(exc)
        seconds.append(time.monotonic() - started)
        ok = blamed == failing
        right += ok
        kinds[kind][0] += ok
        kinds[kind][1] += 1
        print(f"run {run:2d}: rank {failing} {kind:10s} after {steps:2d} all-reduces -> "
              f"blamed rank {blamed} {'ok' if ok else 'WRONG'}", flush=True)
    print(f"\nnamed the first failing rank in {right} of {args.runs} runs "
          f"({', '.join(f'{k} {v[0]}/{v[1]}' for k, v in kinds.items())}); median "
          f"{statistics.median(seconds):.1f}s per run (spawn to error)")
    return 0 if right == args.runs else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
