"""The runtime cap (``max_run_time_hours``) and every layer that enforces it, in one table: how
long past the cap each layer waits and what it then does.

The cap counts from the task's creation (its signed record's ``created_at``). The nearest layer
acts first; each further one is a backstop for when those before it cannot act: every agent
frozen, the caller gone, a node cut off from everything. Each layer takes its grace from here:
the node agents (``AGENT``), a waiting caller (``CALLER``, ``client.capguard``), a local node's
keeper (``KEEPER``: the local provider sets its deadline), a cluster's scheduler
(``SCHEDULER``: the time limit of a Slurm job), a node's own power-off timer
(``POWER_OFF``: a cloud node's ``shutdown``, set by its bootstrap; a pool node's, set by its
daemon while a task runs) and ``flow gc`` (``GC``, through ``lifecycle``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    """One enforcer of the cap: its name, its grace past the cap, and what it does then."""

    name: str
    grace_s: float
    does: str

    def deadline(self, started_at: float, cap_hours: float | None) -> float | None:
        """When this layer acts (the clock of ``started_at``); None for a task without a cap."""
        return None if cap_hours is None else started_at + cap_hours * 3600 + self.grace_s

    def grace_minutes(self) -> int:
        """The grace in whole minutes, rounded up (an OS timer counts minutes)."""
        return math.ceil(self.grace_s / 60)


AGENT = Layer("node agents", 0.0,
              "the leader's agent stops every worker on every node and records TIMED_OUT")
CALLER = Layer("waiting caller", 15.0,
               "records TIMED_OUT and stops the nodes: no agent stopped the task (every agent "
               "stopped answering)")
KEEPER = Layer("local node keeper", 60.0,
               "stops every process of its node whose agent is still there (frozen, or stuck "
               "past its own cap)")
SCHEDULER = Layer("cluster scheduler", 120.0,
                  "the cluster's scheduler ends the job and every process of it (Slurm's "
                  "--time, which the controller enforces with no agent or caller)")
POWER_OFF = Layer("node power-off timer", 600.0,
                  "the OS powers the node off, with no agent or caller: a cloud node's timer "
                  "from its boot, a pool node's while it runs a task")
GC = Layer("flow gc", 3600.0,
           "counts the task as ended by its sealed record and reclaims what it left")
LAYERS = (AGENT, CALLER, KEEPER, SCHEDULER, POWER_OFF, GC)  # in the order they act
