"""Log streaming: lines/second and follow latency of ``task.logs(follow=True)`` on the local
provider, side by side with a plain pipe from a subprocess (the floor any log path sits on).

    python bench/logs.py [--lines 100000] [--ticks 100] [--repeats 3]

Throughput: two nodes (one worker each) print ``--lines`` lines in all as fast as they can;
the client follows the task's logs. Reported: lines/second from the first line printed to the
last line in the client's hands, and the same for a subprocess whose stdout the benchmark
reads directly. Latency: each node prints a line stamped with its clock every 20 ms; the client
records when each arrives through the follow (same machine, same clock); a subprocess printing
the same lines into a pipe is the baseline. Every line is checked: none may be lost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flow_sdk import FlowApp  # noqa: E402

app = FlowApp("bench-logs")

FLOOD = """
import sys, time
count = int(sys.argv[1])
print(f"start {time.time():.6f}", flush=True)
for i in range(count):
    print(f"line {i}", flush=True)
"""
TICK = """
import sys, time
for i in range(int(sys.argv[1])):
    time.sleep(0.02)
    print(f"tick {i} at {time.time():.6f}", flush=True)
"""


@app.function(num_instances=2)
def flood(count: int) -> None:
    import time

    print(f"start {time.time():.6f}", flush=True)
    for i in range(count):
        print(f"line {i}", flush=True)


@app.function(num_instances=2)
def tick(count: int) -> None:
    import time

    for i in range(count):
        time.sleep(0.02)
        print(f"tick {i} at {time.time():.6f}", flush=True)


def flow_throughput(lines: int) -> float:
    per_node = lines // 2
    task = flood.spawn(per_node)
    starts, got, last = [], 0, 0.0
    for line in task.logs(follow=True):
        text = line.split("] ", 2)[2]
        if text.startswith("start "):
            starts.append(float(text.split()[1]))
        else:
            got += 1
            last = time.time()
    task.wait()
    if got != per_node * 2:
        raise AssertionError(f"{per_node * 2 - got} of {per_node * 2} lines were lost")
    return got / (last - min(starts))


def pipe_throughput(lines: int) -> float:
    proc = subprocess.Popen(
        [sys.executable, "-c", FLOOD, str(lines)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    start = float(proc.stdout.readline().split()[1])
    got = sum(1 for _ in proc.stdout)
    last = time.time()
    proc.wait()
    assert got == lines
    return got / (last - start)


def flow_latency(ticks: int) -> list[float]:
    task = tick.spawn(ticks)
    delays = []
    for line in task.logs(follow=True):
        arrived = time.time()
        delays.append(arrived - float(line.rsplit(" ", 1)[1]))
    task.wait()
    if len(delays) != 2 * ticks:
        raise AssertionError(f"{2 * ticks - len(delays)} tick lines were lost")
    return delays


def pipe_latency(ticks: int) -> list[float]:
    proc = subprocess.Popen(
        [sys.executable, "-c", TICK, str(ticks)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    delays = [time.time() - float(line.rsplit(" ", 1)[1]) for line in proc.stdout]
    proc.wait()
    return delays


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--ticks", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("FLOW_HOME", tempfile.mkdtemp(prefix="flow-bench-logs-"))
    ours_rate, pipe_rate, ours_delay, pipe_delay = [], [], [], []
    for _ in range(args.repeats):  # alternate so machine noise hits both sides
        ours_rate.append(flow_throughput(args.lines))
        pipe_rate.append(pipe_throughput(args.lines))
        ours_delay.extend(flow_latency(args.ticks))
        pipe_delay.extend(pipe_latency(args.ticks))
    m_ours, m_pipe = statistics.median(ours_rate), statistics.median(pipe_rate)
    print(f"throughput: {args.lines:,} lines per run, {args.repeats} runs, none lost")
    print(f"{'path':<40}{'median lines/s':>16}{'min':>12}{'max':>12}")
    print(
        f"{'flow follow (2 nodes -> client)':<40}{m_ours:>16,.0f}{min(ours_rate):>12,.0f}"
        f"{max(ours_rate):>12,.0f}"
    )
    print(
        f"{'plain pipe (1 subprocess -> reader)':<40}{m_pipe:>16,.0f}{min(pipe_rate):>12,.0f}"
        f"{max(pipe_rate):>12,.0f}"
    )
    print(f"ratio flow/pipe (median): {m_ours / m_pipe:.2f}")
    print()
    print(
        f"follow latency: {len(ours_delay)} lines printed every 20 ms by 2 nodes "
        f"(pipe: {len(pipe_delay)} lines)"
    )
    print(f"{'path':<40}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}")
    for name, delays in (("flow follow", ours_delay), ("plain pipe", pipe_delay)):
        print(
            f"{name:<40}{pct(delays, 0.5) * 1000:>10.0f}{pct(delays, 0.95) * 1000:>10.0f}"
            f"{max(delays) * 1000:>10.0f}"
        )
    print(f"flow follow p95 under 1 s: {pct(ours_delay, 0.95) < 1.0}")


if __name__ == "__main__":
    main()
