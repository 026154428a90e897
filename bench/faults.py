"""The fault-injection suite as a table: case, time to terminal state, leaks, data lost.

    python bench/faults.py

Runs ``tests/faults`` with pytest (each case asserts its own bounds, zero leaked processes
and no lost logs or results) and prints what every case recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "faults.jsonl"
        env = {**os.environ, "FLOW_FAULT_REPORT": str(report)}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/faults"], cwd=ROOT,
                              env=env, check=False)
        rows = [json.loads(line) for line in report.read_text().splitlines()] \
            if report.exists() else []
    print("\n| case | time to terminal state (s) | leaked processes/instances | data lost |")
    print("|---|---:|---:|---|")
    for row in rows:
        print(f"| {row['case']} | {row['seconds']:.2f} | {row['leaked']} | {row['data_lost']} |")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
