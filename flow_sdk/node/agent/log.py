"""The agent's own lines: to its log stream, and to its stdout (the node's boot log)."""

from __future__ import annotations

import time

from flow_sdk import wire
from flow_sdk.providers.base import LogRecord, Provider
from flow_sdk.wire.loglines import split_lines


class AgentLog:
    """Writes the agent's lines to the task's ``agent.<instance id>`` stream and stdout."""

    def __init__(self, provider: Provider, task_id: str, instance_id: str) -> None:
        self._writer = provider.logs.writer(task_id, wire.agent_stream(instance_id))

    def __call__(self, message: str) -> None:
        now = time.time()
        self._writer.write([LogRecord(now, message)])
        print(f"{time.strftime('%H:%M:%S', time.localtime(now))} {message}", flush=True)

    def event(self, message: str) -> None:
        """A task event (lost node, restart, replacement, generation): the caller shows it
        among the workers' output as an SDK line (each of its lines, when it has several)."""
        for line in split_lines(message):
            self(wire.EVENT_MARK + line)
