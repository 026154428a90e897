"""The node's timeline record: the first time this node reached each phase of its task.

The agent marks phases as it goes (``TimelineRecorder.mark``); each new phase rewrites the
node's whole signed record (``flow_sdk.wire.timeline``). The bootstrap's own phases come from
the file it stamps (``read_boot_phases``). A write that fails is logged and the agent goes on:
the timeline is a diagnosis aid, never a reason to fail a task.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

from flow_sdk.errors import FlowError
from flow_sdk.wire.signing import SignedStore
from flow_sdk.wire.timeline import NodeTimeline, is_phase, timeline_key

# Set by the bootstrap: the file it stamps ``<phase> <epoch seconds>`` lines into.


class TimelineRecorder:
    """One node's timeline: keeps the first time of each phase and writes the record on
    every new one. Safe to call from several threads."""

    def __init__(self, store: SignedStore, task_id: str, instance_id: str,
                 log: Callable[[str], None]) -> None:
        """``log`` hears about a record that could not be written (the agent goes on)."""
        self._store = store
        self._key = timeline_key(task_id, instance_id)
        self._instance_id = instance_id
        self._log = log
        self._node: int | None = None
        self._phases: dict[str, float] = {}
        self._lock = threading.Lock()

    def mark(self, phase: str, at: float | None = None) -> None:
        """Record that this node reached ``phase`` at ``at`` (default: now); a phase already
        marked keeps its first time. Raises ValueError for an unknown phase name."""
        if not is_phase(phase):
            raise ValueError(f"unknown timeline phase {phase!r}")
        with self._lock:
            if phase in self._phases:
                return
            self._phases[phase] = time.time() if at is None else float(at)
            self._write()

    def mark_all(self, phases: dict[str, float]) -> None:
        """Mark several phases at their times (the bootstrap's, say) with one write."""
        with self._lock:
            fresh = {p: float(t) for p, t in phases.items()
                     if is_phase(p) and p not in self._phases}
            if not fresh:
                return
            self._phases.update(fresh)
            self._write()

    def mark_boot_phases(self, path: Path) -> None:
        """Mark the phases the bootstrap stamped into ``path`` (none when it is missing); a
        file that cannot be read is logged."""
        try:
            phases = read_boot_phases(path)
        except OSError as exc:
            self._log(f"could not read the bootstrap's phases from {path}: {exc}")
            return
        self.mark_all(phases)

    def set_node(self, node: int) -> None:
        """This node's rank in the gang, once the rendezvous gave it one (written with the
        next phase)."""
        with self._lock:
            self._node = node

    def snapshot(self) -> NodeTimeline:
        with self._lock:
            return NodeTimeline(self._instance_id, self._node, dict(self._phases))

    def _write(self) -> None:
        """Writes the whole record; called with the lock held."""
        record = NodeTimeline(self._instance_id, self._node, dict(self._phases))
        try:
            self._store.put_record(self._key, record)
        except (FlowError, OSError) as exc:
            self._log(f"could not write the node's timeline record {self._key}: {exc}")


def read_boot_phases(path: Path) -> dict[str, float]:
    """The phases the bootstrap stamped into ``path`` (``<phase> <epoch seconds>`` lines,
    the first time of each phase kept); {} when there is no such file. Lines that are not a
    known phase and a time are skipped; raises OSError when the file cannot be read."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return {}
    phases: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not is_phase(parts[0]) or parts[0] in phases:
            continue
        try:
            at = float(parts[1])
        except ValueError:
            continue
        if math.isfinite(at):
            phases[parts[0]] = at
    return phases
