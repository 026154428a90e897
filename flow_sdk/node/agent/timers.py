"""The agent's two kinds of timer, both on the monotonic clock: a check that is due every so
often, and a deadline."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass
class Every:
    """A check due every ``period_s`` seconds; the first one is due at once."""

    period_s: float
    last: float = -math.inf

    def due(self, now: float) -> bool:
        """Whether the check is due at ``now``; when it is, the next one counts from ``now``."""
        if now - self.last < self.period_s:
            return False
        self.last = now
        return True


@dataclass(frozen=True)
class Deadline:
    """A moment of the monotonic clock."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def passed(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) >= self.at
