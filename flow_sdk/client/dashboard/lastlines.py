"""When each rank of a running task last wrote a line, read from its log stream: a hung rank
shows as one that has been quiet for long. Each read goes on from where the last one of the
same ``LastLines`` stopped, so a page that follows a task reads every line once."""

from __future__ import annotations

from dataclasses import dataclass

from flow_sdk import wire
from flow_sdk.client.task import Task

QUIET_S = 60.0  # a rank quiet this long is shown as quiet


@dataclass(frozen=True)
class RankLine:
    """One rank: when it last wrote a line (None: none yet) and how long ago that was (or,
    with no line yet, how long since the caller launched the task)."""

    rank: int
    node: int
    last_at: float | None
    quiet_s: float
    stalled: bool  # named by one of the task's stall records, with no line since

    @property
    def quiet(self) -> bool:
        return self.stalled or self.quiet_s >= QUIET_S


class LastLines:
    """The ranks of ``task`` and the time of each one's last line."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self._cursors: dict[int, int] = {}
        self._last: dict[int, float] = {}

    def read(self, now: float, since: float, stalled: dict[int, float]) -> list[RankLine]:
        """Every rank, reading only the lines written since the last call; ``since``: when
        the task was launched (the quiet time of a rank with no line yet); ``stalled``: rank
        -> when the last stall record that names it was written."""
        spec = self.task.spec
        logs = self.task.provider.logs
        found = []
        for rank in range(spec.world_size):
            node = rank // spec.slots_per_node
            records, self._cursors[rank] = logs.read(
                self.task.task_id, wire.rank_stream(node, rank), self._cursors.get(rank, 0))
            if records:
                self._last[rank] = records[-1].ts
            last = self._last.get(rank)
            found.append(RankLine(rank, node, last, max(0.0, now - (last or since)),
                                  rank in stalled and (last or 0.0) < stalled[rank]))
        return found
