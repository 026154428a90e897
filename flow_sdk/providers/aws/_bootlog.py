"""What the node bootstrap runs: the node agent, with its raw output shipped to CloudWatch.

``python -m flow_sdk.providers.aws._bootlog`` (environment as for ``python -m
flow_sdk.node.agent``) starts the agent as its child, in its own process group, and copies
every line the agent writes to stdout or stderr, time-stamped as it arrives, into the node's
``boot.<instance id>`` log stream and onto its own stdout (the instance's console and
cloud-init log). A node whose agent dies before it can log anything is still debuggable with
``task.logs(source="boot")``.
It exits with the agent's exit status. Every node runtime starts its nodes with this module.

The bootstrap script keeps its own output in a file of ``"<epoch microseconds> <line>"`` lines
and counts the lines already shipped in the file beside it (``<file>.shipped``). Once the SDK's
environment is installed, this module ships that file too, in the same process, so the script
needs no AWS CLI call per shipment:

- ``--script-log FILE`` (with the agent): the script's lines so far, one second after the
  agent starts (the script's ``tee`` drains its last lines meanwhile);
- ``--ship FILE`` (no agent): the lines not shipped yet, then exit 0, or 1 when they could not
  be shipped (the script then ships them with the AWS CLI).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from flow_sdk.errors import FlowError
from flow_sdk.wire import BootConfig, node_boot
from flow_sdk.providers import get_provider
from flow_sdk.providers.base import LogRecord, LogWriter, boot_stream


def _writer(boot: BootConfig, instance_id: str) -> LogWriter | None:
    try:
        provider = get_provider(boot.provider, boot.provider_config)
        return provider.logs.writer(boot.task_id, boot_stream(instance_id))
    except FlowError as exc:  # the agent reports its own config problems; keep it running
        print(f"flow boot log: cannot ship boot output ({exc}); console only", flush=True)
        return None


def script_records(log: Path) -> tuple[list[LogRecord], int]:
    """The script's lines of ``log`` past the count in ``<log>.shipped``, as records, and the
    count of lines ``log`` holds. A line whose stamp is not a number is kept at time 0, as the
    script's own shipping does."""
    mark = log.with_name(log.name + ".shipped")
    done = int(mark.read_text() or 0) if mark.exists() else 0
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    records = []
    for line in lines[done:]:
        stamp, _, text = line.partition(" ")
        records.append(LogRecord(int(stamp) / 1e6 if stamp.isdigit() else 0.0, text or " "))
    return records, len(lines)


def mark_shipped(log: Path, count: int) -> None:
    """Count the first ``count`` lines of ``log`` as shipped."""
    log.with_name(log.name + ".shipped").write_text(str(count))


def _ship_later(writer: LogWriter, log: Path) -> None:
    time.sleep(1.0)  # the script's tee drains the lines it printed before starting us
    try:
        records, count = script_records(log)
        writer.write(records)  # the writer keeps what it could not ship yet, and retries
        mark_shipped(log, count)
    except (OSError, ValueError, FlowError) as exc:
        print(f"flow boot log: could not ship the bootstrap's lines ({exc}); the node ships "
              "them when it powers off", flush=True)


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m flow_sdk.providers.aws._bootlog")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--script-log", type=Path, help="also ship this bootstrap log")
    mode.add_argument("--ship", type=Path, help="only ship this bootstrap log, then exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(sys.argv[1:] if argv is None else argv)
    boot, instance_id, _address = node_boot()
    writer = _writer(boot, instance_id)
    if args.ship is not None:
        if writer is None:
            return 1
        try:
            records, count = script_records(args.ship)
            writer.write(records)
            writer.close()  # shipped, or raises: only then are they counted
            mark_shipped(args.ship, count)
        except (OSError, ValueError, FlowError) as exc:
            print(f"flow boot log: {exc}", flush=True)
            return 1
        return 0
    agent = subprocess.Popen([sys.executable, "-m", boot.node_module],
                             stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def forward(signum: int, frame: FrameType | None) -> None:
        if agent.poll() is None:
            agent.send_signal(signum)  # the agent stops its workers; keep draining its output

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    shipper = None
    if writer is not None and args.script_log is not None:
        shipper = threading.Thread(target=_ship_later, args=(writer, args.script_log),
                                   daemon=True)
        shipper.start()
    assert agent.stdout is not None
    out = sys.stdout.buffer
    for raw in iter(agent.stdout.readline, b""):
        out.write(raw)
        out.flush()
        if writer is not None:
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            writer.write([LogRecord(time.time(), text)])
    code = agent.wait()
    if shipper is not None:
        shipper.join()
    if writer is not None:
        try:
            writer.close()
        except FlowError as exc:
            print(f"flow boot log: {exc}", flush=True)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
