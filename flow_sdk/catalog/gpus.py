"""The GPU models flow-sdk knows, with the memory sizes and form factors they come in.

This table is the single source for GPU names: the spec parser validates against it and the
provider catalogs map its names to instance types. It also says how each form factor links the
GPUs inside one node (``intranode_interconnect``): the SXM socket generation (NVLink through
the board: ``sxm2`` V100, ``sxm4`` A100, ``sxm5`` H100/H200, ``sxm6`` B200) or ``pcie``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    name: str  # canonical lower-case name, e.g. "h100"
    memory_gb: tuple[int, ...]  # sizes it is sold in; the first is the default
    form_factors: tuple[str, ...]  # e.g. ("sxm", "pcie"); the first is the default
    intranode: tuple[str, ...]  # the link between a node's GPUs, one per form factor
    aliases: tuple[str, ...] = ()

    @property
    def default_memory_gb(self) -> int:
        return self.memory_gb[0]

    def intranode_of(self, form_factor: str) -> str:
        """How GPUs of this model in ``form_factor`` talk inside one node, e.g. ``sxm5``."""
        return self.intranode[self.form_factors.index(form_factor)]

    def form_with(self, intranode: str) -> str | None:
        """The form factor whose GPUs link by ``intranode``, or None when none does."""
        for form, link in zip(self.form_factors, self.intranode, strict=True):
            if link == intranode:
                return form
        return None


GPU_MODELS: tuple[GpuModel, ...] = (
    GpuModel("b200", (180,), ("sxm",), ("sxm6",)),
    GpuModel("h200", (141,), ("sxm",), ("sxm5",)),
    GpuModel("h100", (80,), ("sxm", "pcie"), ("sxm5", "pcie")),
    GpuModel("a100", (40, 80), ("sxm", "pcie"), ("sxm4", "pcie")),
    GpuModel("l40s", (48,), ("pcie",), ("pcie",)),
    GpuModel("a10g", (24,), ("pcie",), ("pcie",)),
    GpuModel("l4", (24,), ("pcie",), ("pcie",)),
    GpuModel("v100", (16, 32), ("sxm",), ("sxm2",)),
    GpuModel("t4", (16,), ("pcie",), ("pcie",)),
)
INTRANODE_INTERCONNECTS: tuple[str, ...] = tuple(sorted({
    link for model in GPU_MODELS for link in model.intranode}))

_BY_NAME: dict[str, GpuModel] = {}
for _model in GPU_MODELS:
    for _key in (_model.name, *_model.aliases):
        _BY_NAME[_key] = _model


def find_gpu_model(name: str) -> GpuModel | None:
    """The model called ``name`` (case-insensitive), or None when flow-sdk does not know it."""
    return _BY_NAME.get(name.strip().lower())
