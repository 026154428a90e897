"""The dashboard's live log view under load, side by side with ``flow logs -f`` in the same run.

    python bench/ui_logs.py [--rate 10000] [--seconds 5]

A task of 2 nodes x 2 workers (4 ranks) prints ``--rate`` lines per second in all for
``--seconds``, each line stamped with the time it was printed. While it prints, a headless
Chromium (Debian's, under Playwright) shows the task's page of ``flow ui`` and records, with a
MutationObserver, when each line appears in the page; a ``flow logs -f`` subprocess follows the
same task and the benchmark records when each line reaches it. The lag of a line is its
arrival minus its stamp (one machine, one clock). Every line is counted: none may be lost.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "client" / "dashboard"))

from dashboard_testing import FLOW, launch_chromium, start_ui  # noqa: E402

from flow_sdk import FlowApp  # noqa: E402

app = FlowApp("bench-ui-logs")

# Lag of every line that appears in the log view, measured in the page at the moment it is
# added (Date.now() is this machine's clock, as is the stamp printed in the line).
OBSERVER = """
window.__lags = [];
new MutationObserver((changes) => {
  const now = Date.now() / 1000;
  for (const change of changes) for (const node of change.addedNodes) {
    if (!node.classList || !node.classList.contains("line")) continue;
    const text = node.textContent;
    if (text.includes(" L r")) window.__lags.push(now - parseFloat(text.slice(text.lastIndexOf(" ") + 1)));
  }
}).observe(document, {childList: true, subtree: true});
"""


@app.function(num_instances=2, workers_per_node=2)
def flood(go: str, rate: float, seconds: float) -> int:
    """Each rank prints its share of ``rate`` lines/s for ``seconds``, from the time the go
    file names; every line ends with the time it was printed."""
    import os
    import sys
    import time
    from pathlib import Path

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    print(f"ready {rank}", flush=True)
    while not Path(go).exists():
        time.sleep(0.005)
    start = float(Path(go).read_text())
    mine = rate / world
    total = int(mine * seconds)
    done = 0
    while done < total:
        time.sleep(max(0.0, start + done / mine - time.time()))
        now = time.time()
        due = min(total, int((now - start) * mine) + 1)
        sys.stdout.write("".join(f"L r{rank} {i} {now:.6f}\n" for i in range(done, due)))
        sys.stdout.flush()
        done = due
    return total


def follow_cli(task_id: str, env: dict[str, str], lags: list[float]) -> subprocess.Popen[str]:
    """``flow logs -f TASK`` in a subprocess; a thread records each line's lag."""
    proc = subprocess.Popen([FLOW, "logs", "-f", task_id], stdout=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env=env, bufsize=1)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if " L r" in line:
                lags.append(time.time() - float(line.rsplit(" ", 1)[1]))

    threading.Thread(target=read, daemon=True).start()
    return proc


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(rate: float, seconds: float, home: Path) -> tuple[int, list[float], list[float]]:
    from playwright.sync_api import sync_playwright

    env = {**os.environ, "FLOW_HOME": str(home)}
    go = home / "go"
    task = flood.spawn(str(go), rate, seconds)
    expected = 4 * int(rate / 4 * seconds)
    ui = start_ui(home)
    cli_lags: list[float] = []
    cli = follow_cli(task.task_id, env, cli_lags)
    try:
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            page = browser.new_page()  # type: ignore[attr-defined]
            page.add_init_script(OBSERVER)
            page.goto(ui.url.replace("/?", f"/tasks/{task.task_id}?"))
            page.wait_for_function("() => [...document.querySelectorAll('#log div.line')]"
                                   ".filter((d) => d.textContent.includes('] ready ')).length"
                                   " === 4", timeout=120_000)
            time.sleep(1.0)  # `flow logs -f` is up too by now
            (home / "go.tmp").write_text(f"{time.time() + 0.5:.6f}")
            os.replace(home / "go.tmp", go)
            page.wait_for_function(f"() => window.__lags.length >= {expected}",
                                   timeout=(seconds + 60) * 1000, polling=200)
            page_lags = page.evaluate("window.__lags")
            browser.close()  # type: ignore[attr-defined]
        task.wait(timeout=120)
        cli.wait(timeout=60)
    finally:
        if cli.poll() is None:
            cli.send_signal(signal.SIGINT)
            cli.wait(timeout=10)
        ui.stop()
        if not task.status.is_terminal:
            task.cancel()
    return expected, page_lags, cli_lags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=10_000, help="lines/s, all ranks")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        os.environ["FLOW_HOME"] = str(Path(tmp) / "home")
        expected, page, cli = run(args.rate, args.seconds, Path(os.environ["FLOW_HOME"]))
    print(f"{expected} lines from 4 ranks at {args.rate:,.0f} lines/s for {args.seconds:g} s")
    print(f"{'follower':<26}{'lines':>8}{'lost':>6}{'p50 s':>8}{'p95 s':>8}{'p99 s':>8}"
          f"{'max s':>8}")
    for name, lags in (("flow ui page (Chromium)", page), ("flow logs -f", cli)):
        print(f"{name:<26}{len(lags):>8}{expected - len(lags):>6}{pct(lags, .5):>8.3f}"
              f"{pct(lags, .95):>8.3f}{pct(lags, .99):>8.3f}{max(lags, default=0):>8.3f}")
    print(f"ratio page / flow logs -f: p50 {pct(page, .5) / pct(cli, .5):.2f}, "
          f"p99 {pct(page, .99) / pct(cli, .99):.2f}")
    if expected - len(page) or expected - len(cli):
        raise SystemExit("lines were lost")


if __name__ == "__main__":
    main()
