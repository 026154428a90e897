"""What a provider honours of a task's options, declared once per provider
(``Provider.capabilities``).

An option is honoured (the provider does what it says), accepted with a note (it runs without
it, and the note, shown with the plan, says what happens instead: the local provider runs
``image=`` tasks in this machine's Python environment), or refused: the launch is refused
before anything starts, naming the provider and the option. A provider declares nothing by
default, so a new provider refuses every option below until it says it honours it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum

from flow_sdk.errors import FieldProblem
from flow_sdk.spec import TaskSpec


class Support(str, Enum):
    HONOURED = "honoured"
    NOTED = "accepted with a note"  # runs without it; the note says what happens instead
    REFUSED = "refused"


@dataclass(frozen=True)
class _Option:
    spec_field: str  # the field a refusal names
    what: str
    asked: Callable[[TaskSpec], bool]


def _volumes(interface: str) -> Callable[[TaskSpec], bool]:
    return lambda spec: any(v.interface == interface for v in spec.volumes.values())


# Each declared capability: the option of a task that needs it.
OPTIONS: Mapping[str, _Option] = {
    "image": _Option("image", "a container image", lambda spec: spec.image is not None),
    "price_caps": _Option("max_price_per_hour", "a price cap",
                          lambda spec: spec.max_price_per_hour is not None),
    "file_volumes": _Option("volumes", "file volumes (interface='file')", _volumes("file")),
    "block_volumes": _Option("volumes", "block volumes (interface='block')", _volumes("block")),
    "s3_mounts": _Option("mounts", "read-only S3 mounts", lambda spec: bool(spec.mounts)),
    "interconnect": _Option("internode_interconnect", "a chosen internode interconnect",
                            lambda spec: spec.internode_interconnect is not None),
    "pools": _Option("pool", "warm pools", lambda spec: spec.pool is not None),
}


@dataclass(frozen=True)
class Capabilities:
    """Each option's support; ``notes`` says, for each one accepted with a note, what
    happens instead."""

    image: Support = Support.REFUSED
    price_caps: Support = Support.REFUSED
    file_volumes: Support = Support.REFUSED
    block_volumes: Support = Support.REFUSED
    s3_mounts: Support = Support.REFUSED
    interconnect: Support = Support.REFUSED
    pools: Support = Support.REFUSED
    notes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        noted = {name for name in OPTIONS if self.support(name) is Support.NOTED}
        if noted != set(self.notes):
            raise ValueError(f"capabilities accepted with a note need exactly one note each: "
                             f"noted {sorted(noted)}, notes for {sorted(self.notes)}")

    @classmethod
    def every(cls) -> Capabilities:
        """Every option honoured."""
        return cls(**{f.name: Support.HONOURED for f in fields(cls) if f.name in OPTIONS})

    def support(self, name: str) -> Support:
        value: Support = getattr(self, name)
        return value

    def problems(self, provider: str, spec: TaskSpec) -> list[FieldProblem]:
        """A problem for each option ``spec`` asks for that ``provider`` refuses."""
        return [FieldProblem(option.spec_field, f"the {provider} provider does not support "
                             f"{option.what}; drop {option.spec_field}=, or run the task on a "
                             "provider that does (docs/providers.md lists what each honours)")
                for name, option in OPTIONS.items()
                if option.asked(spec) and self.support(name) is Support.REFUSED]

    def notes_for(self, provider: str, spec: TaskSpec) -> list[str]:
        """A line for each option ``spec`` asks for that ``provider`` runs without."""
        return [f"{provider}: {OPTIONS[name].spec_field}= is not used: {note}"
                for name, note in self.notes.items() if OPTIONS[name].asked(spec)]
