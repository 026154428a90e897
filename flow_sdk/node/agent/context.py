"""What every part of the agent works with: the node, its provider, its records and its log."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from flow_sdk.node.agent.gang import Gang
from flow_sdk.node.agent.log import AgentLog
from flow_sdk.node.agent.oom import KernelLog
from flow_sdk.node.agent.records import NodeRecords
from flow_sdk.node.agent.spawn import WarmStart
from flow_sdk.node.agent.timeline import TimelineRecorder
from flow_sdk.wire import BootConfig
from flow_sdk.providers.base import Provider


@dataclass(frozen=True)
class NodeContext:
    """One node of one task, as its agent sees it."""

    boot: BootConfig
    instance_id: str
    address: str
    workdir: Path
    provider: Provider
    secret: bytes  # the task's secret: it signs the records and admits nodes to the store
    records: NodeRecords
    log: AgentLog
    gang: Gang  # where the task's nodes come from: its own, or a pool's
    kernel: KernelLog  # the kernel's log since the agent started: who the OOM killer killed
    timeline: TimelineRecorder  # when this node reached each phase of the task
    # The node's warm interpreter, workers fork from it: a pool node's, or the fork server
    # the agent started for the task's workers (``Agent._warm_up``).
    template: WarmStart | None = None
    code_cache: Path | None = None  # a pool node's calls' code, kept by digest between tasks
    stop_requested: threading.Event = field(default_factory=threading.Event)  # SIGTERM
    # WARNING_SIGNAL: a scheduler's warning that its time limit is near (Slurm's --signal)
    warned: threading.Event = field(default_factory=threading.Event)

    @property
    def task_id(self) -> str:
        return self.boot.task_id
