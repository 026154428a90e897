"""What a provider's ``gc`` found and did (``Provider.gc``, ``flow gc``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GcReport:
    """What ``gc`` found and did. With ``dry_run`` the same lists say what it would do."""

    provider: str
    dry_run: bool
    terminated_instances: list[str] = field(default_factory=list)
    stopped_processes: list[int] = field(default_factory=list)  # nodes played by processes
    deleted: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)  # still in use: the next gc removes them
    live_tasks: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # task id -> why it was reclaimed

    def __str__(self) -> str:
        reclaim, stop = ("would reclaim", "would stop") if self.dry_run else ("reclaimed",
                                                                              "stopped")
        lines = [(f"{self.provider}: {reclaim}: {len(self.terminated_instances)} instance(s), "
                  f"{len(self.deleted)} other resource(s); {stop} "
                  f"{len(self.stopped_processes)} process(es) of {len(self.reasons)} ended or "
                  f"orphaned task(s); {len(self.deferred)} deferred; "
                  f"{len(self.live_tasks)} live task(s) kept")]
        lines += [f"  task {task}: {why}" for task, why in sorted(self.reasons.items())]
        lines += [f"  deferred: {item}" for item in self.deferred]
        return "\n".join(lines)
