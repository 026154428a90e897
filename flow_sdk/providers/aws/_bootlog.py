"""What the node bootstrap runs: the node agent, with its raw output shipped to CloudWatch.

``python -m flow_sdk.providers.aws._bootlog`` (environment as for ``python -m
flow_sdk.node.agent``) starts the agent as its child, in its own process group, and copies
every line the agent writes to stdout or stderr, time-stamped as it arrives, into the node's
``boot.<instance id>`` log stream and onto its own stdout (the instance's console and
cloud-init log). A node whose agent dies before it can log anything is still debuggable with
``task.logs(source="boot")``.
It exits with the agent's exit status. Every node runtime starts its nodes with this module.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
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


def main() -> int:
    boot, instance_id, _address = node_boot()
    writer = _writer(boot, instance_id)
    agent = subprocess.Popen([sys.executable, "-m", boot.node_module],
                             stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def forward(signum: int, frame: FrameType | None) -> None:
        if agent.poll() is None:
            agent.send_signal(signum)  # the agent stops its workers; keep draining its output

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    assert agent.stdout is not None
    out = sys.stdout.buffer
    for raw in iter(agent.stdout.readline, b""):
        out.write(raw)
        out.flush()
        if writer is not None:
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            writer.write([LogRecord(time.time(), text)])
    code = agent.wait()
    if writer is not None:
        try:
            writer.close()
        except FlowError as exc:
            print(f"flow boot log: {exc}", flush=True)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
