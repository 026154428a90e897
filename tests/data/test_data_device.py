"""Batches on a device: the staging path equals the plain CPU path bit for bit.

The CUDA side of the same path (pinned buffers, side stream, events) runs in tests/gpu."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from flow_sdk.data import DataConnector
from flow_sdk.data._device import RING, DeviceStager

Batches = list[dict[str, torch.Tensor]]


def assert_same(ours: Batches, plain: Batches) -> None:
    assert len(ours) == len(plain)
    for got, want in zip(ours, plain):
        assert list(got) == list(want)
        for name in want:
            assert got[name].dtype == want[name].dtype and got[name].device.type == "cpu"
            assert torch.equal(got[name], want[name])


@pytest.fixture
def connector(uneven_dir: tuple[Path, list[int]]) -> DataConnector:
    return DataConnector.from_parquet(uneven_dir[0])


@pytest.mark.parametrize("options", [
    {"batch_size": 1000},
    {"batch_size": 4096, "shuffle": True, "seed": 3},
    {"batch_size": 777, "cast_float64": False, "drop_last": True},
    {"batch_size": 512, "prefetch": 2},
])
def test_cpu_device_batches_equal_the_plain_batches(connector: DataConnector,
                                                    options: dict) -> None:
    plain = [{k: v.clone() for k, v in b.items()} for b in connector.to_torch_dataset(**options)]
    ours = list(connector.to_torch_dataset(**options, device="cpu"))
    assert_same(ours, plain)
    assert ours[0]["x64"].dtype == (torch.float64 if options.get("cast_float64") is False
                                    else torch.float32)


def test_staging_buffers_are_reused_and_handed_out_batches_stay_intact() -> None:
    stager = DeviceStager(torch.device("cpu"))
    batches = [{"a": torch.full((8, 2), float(i)), "b": torch.arange(8) + i} for i in range(7)]
    out = list(stager.batches(iter(batches)))
    assert_same(out, batches)
    first = stager.slots[0].buffers["a"]
    again = list(stager.batches(iter(batches[:RING])))
    assert stager.slots[0].buffers["a"] is first  # same size and dtype: the buffer is reused
    assert_same(again, batches[:RING])
    assert_same(out, batches)  # earlier batches were not overwritten by reuse


def test_staging_grows_for_a_larger_batch_and_follows_dtype_changes() -> None:
    stager = DeviceStager(torch.device("cpu"))
    batches = [{"a": torch.ones(4)}, {"a": torch.arange(10, dtype=torch.float64)},
               {"a": torch.arange(3)}, {"a": torch.zeros(0)}]
    assert_same(list(stager.batches(iter(batches))), batches)


def test_cuda_without_cuda_fails_before_any_read(connector: DataConnector,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only node
    with pytest.raises(ValueError, match="no CUDA device"):
        connector.to_torch_dataset(256, device="cuda")
    with pytest.raises(ValueError, match="not supported"):
        connector.to_torch_dataset(256, device="mps")


def test_device_batches_are_not_made_in_dataloader_workers(connector: DataConnector) -> None:
    loader = DataLoader(connector.to_torch_dataset(256, device="cpu"), batch_size=None,
                        num_workers=1)
    with pytest.raises(RuntimeError, match="not in DataLoader workers"):
        next(iter(loader))
