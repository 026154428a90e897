"""When the test command's runners work, and how busy they keep the machine's cores.

    python bench/suite_timeline.py [PYTEST ARGS ...]

Runs ``python -m pytest -q -p no:cacheprovider`` (plus the arguments given, e.g. ``-n 4``)
with this module as a plugin: each runner logs when each of its tests starts and ends. Beside
it, ``/proc/stat`` is read once a second. Prints, per runner, when its first test started and
its last ended (seconds after the launch) and its seconds inside tests; then the cores kept
busy, on average and per 30 s window. A suite whose runners end together, with the cores near
full, is shortened only by less CPU or less test time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TextIO

LOG_DIR = "SUITE_TIMELINE_DIR"  # where each runner writes its lines
WINDOW_S = 30

_log: TextIO | None = None


def _write(event: str, nodeid: str) -> None:
    global _log
    if _log is None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "controller")
        _log = open(Path(os.environ[LOG_DIR]) / f"{worker}.jsonl", "a")  # noqa: SIM115
    _log.write(json.dumps([event, nodeid, time.time()]) + "\n")
    _log.flush()


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _write("start", nodeid)


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    _write("end", nodeid)


def _cpu_ticks() -> tuple[int, int]:
    """(busy, idle) jiffies of all cores, from the first line of ``/proc/stat``."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, idle


def _sample(samples: list[tuple[float, int, int]], done: threading.Event) -> None:
    while not done.is_set():
        samples.append((time.time(), *_cpu_ticks()))
        done.wait(1.0)


def _runner_rows(folder: Path, launched: float) -> list[str]:
    rows = []
    for log in sorted(folder.glob("gw*.jsonl")):
        events = [json.loads(line) for line in log.read_text().splitlines()]
        starts = {nodeid: at for kind, nodeid, at in events if kind == "start"}
        if not starts:  # a runner that was given no test
            continue
        inside = sum(at - starts[nodeid] for kind, nodeid, at in events if kind == "end")
        rows.append(f"| {log.stem} | {min(starts.values()) - launched:.1f} | "
                    f"{max(at for _, _, at in events) - launched:.1f} | {inside:.0f} |")
    return rows


def _busy_cores(samples: list[tuple[float, int, int]], launched: float) -> tuple[float, str]:
    """Cores busy over the whole run, and per window, from consecutive samples."""
    windows: dict[int, list[int]] = {}
    for (at, busy_a, idle_a), (_, busy_b, idle_b) in zip(samples, samples[1:]):
        window = windows.setdefault(int((at - launched) // WINDOW_S), [0, 0])
        window[0] += busy_b - busy_a
        window[1] += idle_b - idle_a
    cores = os.cpu_count() or 1
    total_busy = sum(b for b, _ in windows.values())
    total = sum(b + i for b, i in windows.values()) or 1
    per_window = " ".join(f"{k * WINDOW_S}s:{b / ((b + i) or 1) * cores:.2f}"
                          for k, (b, i) in sorted(windows.items()))
    return total_busy / total * cores, per_window


def main(args: list[str]) -> int:
    folder = Path(tempfile.mkdtemp(prefix="suite-timeline-"))
    env = {**os.environ, LOG_DIR: str(folder),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                       os.environ.get("PYTHONPATH")]))}
    samples: list[tuple[float, int, int]] = []
    done = threading.Event()
    sampler = threading.Thread(target=_sample, args=(samples, done), daemon=True)
    launched = time.time()
    sampler.start()
    try:
        code = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-p", Path(__file__).stem, *args], env=env).returncode
    finally:
        done.set()
        sampler.join()
    print(f"\npytest exited {code} after {time.time() - launched:.1f} s\n")
    print("| runner | first test starts (s) | last test ends (s) | seconds in tests |")
    print("|---|---:|---:|---:|")
    print("\n".join(_runner_rows(folder, launched)))
    average, per_window = _busy_cores(samples, launched)
    print(f"\ncores busy: {average:.2f} of {os.cpu_count()} on average; "
          f"per {WINDOW_S} s window: {per_window}")
    print(f"(the runners' logs: {folder})")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
