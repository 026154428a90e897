"""What the SDK's short-lived processes cost to start and to end, in CPU seconds.

    python bench/process_costs.py [--base REV] [--rounds 8]

Two tables, from one run:

* **start**: the imports each kind of process does before its own work (the simulated
  instance's root helper before it runs the user-data, the simulated account's server before
  moto, the simulated instance, a node agent, the CLI), in this checkout and in a
  ``git worktree`` of ``REV`` (default ``HEAD``), the two interleaved round by round;
* **exit**: a process that imported torch (as a pool daemon's warm template does) or a node
  agent's modules, ended by ``sys.exit`` (the interpreter's teardown) and by
  ``flow_sdk.system.procs.exit_now`` (atexit handlers, flushed output, no teardown), in this
  checkout.

Each figure is the mean CPU (user + system) of one fresh interpreter, read with
``RUSAGE_CHILDREN``: CPU, not wall time, so that other load on the machine matters less.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

START = {
    "simulated instance's root helper": "import flow_sdk.sim._root",
    "simulated account's server": "import flow_sdk.sim._serve",
    "simulated instance": "import flow_sdk.sim._instance",
    "node agent": "import flow_sdk.node.agent.main",
    "flow CLI": "import flow_sdk.cli",
}
EXIT = {
    "torch imported": "import torch",
    "node agent's modules": "import flow_sdk.node.agent.main",
}
ENDINGS = {"sys.exit": "import sys; sys.exit(0)",
           "procs.exit_now": "from flow_sdk.system.procs import exit_now; exit_now(0)"}


def cpu_of(code: str, tree: Path) -> float:
    """CPU seconds of one interpreter running ``code`` with ``tree`` first on its path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=tree,
                   stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def mean_cpu(probes: dict[str, dict[str, tuple[str, Path]]], rounds: int
             ) -> dict[str, dict[str, float]]:
    """Each probe's mean CPU per column; every round runs every probe in every column once."""
    totals = {row: {column: 0.0 for column in columns} for row, columns in probes.items()}
    for _ in range(rounds):
        for row, columns in probes.items():
            for column, (code, tree) in columns.items():
                totals[row][column] += cpu_of(code, tree)
    return {row: {column: total / rounds for column, total in columns.items()}
            for row, columns in totals.items()}


def table(title: str, results: dict[str, dict[str, float]], old: str, new: str) -> str:
    lines = [f"| {title} | {old} (s) | {new} (s) | {new} / {old} |", "|---|---:|---:|---:|"]
    for row, columns in results.items():
        lines.append(f"| {row} | {columns[old]:.3f} | {columns[new]:.3f} | "
                     f"{columns[new] / columns[old]:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="the revision to compare starts with")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flow-bench-base-") as scratch:
        base = Path(scratch) / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base),
                        args.base], check=True, capture_output=True)
        try:
            for tree in (base, REPO):  # as the set-up does: no probe compiles a module
                subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "flow_sdk")],
                               check=True)
            starts = mean_cpu({row: {args.base: (code, base), "this checkout": (code, REPO)}
                               for row, code in START.items()}, args.rounds)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(base)], check=True, capture_output=True)
    exits = mean_cpu({row: {ending: (f"{code}\n{tail}", REPO)
                            for ending, tail in ENDINGS.items()}
                      for row, code in EXIT.items()}, args.rounds)
    print(table("start: the imports of", starts, args.base, "this checkout"))
    print()
    print(table("exit of a process with", exits, "sys.exit", "procs.exit_now"))


if __name__ == "__main__":
    main()
