"""to_torch_dataset(device="cuda"): batches on the GPU equal the CPU batches bit for bit."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from flow_sdk.data import DataConnector


@pytest.fixture
def connector() -> DataConnector:
    rng = np.random.default_rng(0)
    rows = 300_001
    return DataConnector.from_arrow(pa.table({
        "x64": rng.standard_normal(rows), "x32": rng.standard_normal(rows).astype(np.float32),
        "id": np.arange(rows), "small": (np.arange(rows) % 7).astype(np.int32)}))


@pytest.mark.parametrize("options", [
    {"batch_size": 65_536},
    {"batch_size": 4096, "shuffle": True, "seed": 1},
    {"batch_size": 1000, "cast_float64": False},
])
def test_cuda_batches_equal_cpu_batches(connector: DataConnector, options: dict) -> None:
    cpu = [{k: v.clone() for k, v in b.items()} for b in connector.to_torch_dataset(**options)]
    gpu = list(connector.to_torch_dataset(**options, device="cuda"))
    torch.cuda.synchronize()
    assert len(gpu) == len(cpu)
    for got, want in zip(gpu, cpu):
        for name in want:
            assert got[name].device.type == "cuda"
            assert got[name].dtype == want[name].dtype
            assert torch.equal(got[name].cpu(), want[name])


def test_staging_buffers_are_pinned_and_reused(connector: DataConnector) -> None:
    from flow_sdk.data._device import DeviceStager

    stager = DeviceStager(torch.device("cuda", torch.cuda.current_device()))
    batches = list(connector.to_torch_dataset(4096))[:8]
    out = list(stager.batches(iter(batches)))
    torch.cuda.synchronize()
    buffers = [b for slot in stager.slots for b in slot.buffers.values()]
    assert buffers and all(b.is_pinned() for b in buffers)
    assert all(torch.equal(o["x64"].cpu(), b["x64"]) for o, b in zip(out, batches))
