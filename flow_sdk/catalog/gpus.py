"""The GPU models flow-sdk knows, with the memory sizes and form factors they come in.

This table is the single source for GPU names: the spec parser validates against it and the
provider catalogs map its names to instance types.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    name: str  # canonical lower-case name, e.g. "h100"
    memory_gb: tuple[int, ...]  # sizes it is sold in; the first is the default
    form_factors: tuple[str, ...]  # e.g. ("sxm", "pcie"); the first is the default
    aliases: tuple[str, ...] = ()

    @property
    def default_memory_gb(self) -> int:
        return self.memory_gb[0]


GPU_MODELS: tuple[GpuModel, ...] = (
    GpuModel("b200", (180,), ("sxm",)),
    GpuModel("h200", (141,), ("sxm",)),
    GpuModel("h100", (80,), ("sxm", "pcie")),
    GpuModel("a100", (40, 80), ("sxm", "pcie")),
    GpuModel("l40s", (48,), ("pcie",)),
    GpuModel("a10g", (24,), ("pcie",)),
    GpuModel("l4", (24,), ("pcie",)),
    GpuModel("v100", (16, 32), ("sxm",)),
    GpuModel("t4", (16,), ("pcie",)),
)

_BY_NAME: dict[str, GpuModel] = {}
for _model in GPU_MODELS:
    for _key in (_model.name, *_model.aliases):
        _BY_NAME[_key] = _model


def find_gpu_model(name: str) -> GpuModel | None:
    """The model called ``name`` (case-insensitive), or None when flow-sdk does not know it."""
    return _BY_NAME.get(name.strip().lower())
