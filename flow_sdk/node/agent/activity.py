"""What this node's workers are doing before the caller's code runs: starting (the
interpreter), importing the caller's code (unpickling the call imports the modules it uses),
running it. Each worker writes the stage it reached into a file of its own
(``WorkerGroup.stage_path``); the agent reads them and writes its node record again when its
least advanced worker moves on, so the caller can say why nothing has been printed yet. It
stops once every worker runs the caller's code."""

from __future__ import annotations

from flow_sdk.errors import FlowError
from flow_sdk.node.agent.context import NodeContext
from flow_sdk.node.agent.timers import Every
from flow_sdk.node.agent.workers import WorkerGroup
from flow_sdk.node.rendezvous import Membership
from flow_sdk.wire import NodePhase
from flow_sdk.wire.records import WORKER_ACTIVITIES

CHECK_S = 0.25
STARTING, RUNNING = WORKER_ACTIVITIES[0], WORKER_ACTIVITIES[-1]


class WorkerActivity:
    """Reads the workers' stages and writes the node's record again when the node's changes
    (it was written with ``STARTING`` when the workers started)."""

    def __init__(self, node: NodeContext, m: Membership, workers: WorkerGroup) -> None:
        self.node, self.m, self.workers = node, m, workers
        self.shown = STARTING
        self.check_due = Every(CHECK_S)

    def _stage(self, rank: int) -> str:
        try:
            text = self.workers.stage_path(rank).read_text(encoding="ascii")
        except (FileNotFoundError, UnicodeDecodeError):
            return STARTING  # not written yet
        return text if text in WORKER_ACTIVITIES else STARTING

    def current(self) -> str:
        """The least advanced worker's stage."""
        stages = [self._stage(w.rank) for w in self.workers.workers]
        return min(stages, key=WORKER_ACTIVITIES.index, default=STARTING)

    def check(self, now: float) -> None:
        if self.shown == RUNNING or not self.check_due.due(now):
            return
        found = self.current()
        if found == self.shown:
            return
        self.shown = found
        try:
            self.node.records.write_node(self.m, NodePhase.RUNNING, len(self.workers.workers),
                                         found)
        except FlowError as exc:  # only what the caller is told: the task goes on
            self.node.log(f"could not record that the workers are {found}: {exc}")
