"""Batches on a device: the staging path equals the plain CPU path bit for bit.

The CUDA side of the same path (pinned buffers, side stream, events) runs in tests/gpu."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader

from flow_sdk.data import DataConnector
from flow_sdk.data import _device
from flow_sdk.data._device import ALIGN_BYTES, RING, DeviceStager

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


def mixed_table(rows: int) -> pa.Table:
    """Every rule of the lean path in one in-memory table, two chunks per column: float64
    with and without nulls (values that float32 must round), decimals, integers with nulls."""
    rng = np.random.default_rng(7)
    x64 = rng.standard_normal(rows) * 1e3
    with_nulls = [None if i % 5 == 0 else float(v) for i, v in enumerate(x64)]
    ints = [None if i % 7 == 0 else i for i in range(rows)]
    halves = [slice(0, rows // 2), slice(rows // 2, rows)]
    columns = {
        "x64": [pa.array(x64[h]) for h in halves],
        "x64_nulls": [pa.array(with_nulls[h], pa.float64()) for h in halves],
        "dec": [pa.array([Decimal(f"{v:.3f}") for v in x64[h]], pa.decimal128(12, 3))
                for h in halves],
        "i_nulls": [pa.array(ints[h], pa.int64()) for h in halves],
        "x32": [pa.array(x64[h].astype(np.float32)) for h in halves],
    }
    return pa.table({name: pa.chunked_array(chunks) for name, chunks in columns.items()})


@pytest.mark.parametrize("options", [
    {"batch_size": 100},
    {"batch_size": 64, "shuffle": True, "seed": 5, "shuffle_buffer_rows": 200},
    {"batch_size": 128, "cast_float64": False},
])
def test_the_cast_in_the_staging_copy_equals_the_plain_cast(
        options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    arrived: set[torch.dtype] = set()  # x64 as the stager gets it

    def layout(batch: dict[str, torch.Tensor], cast_float64: bool) -> _device.Layout:
        arrived.add(batch["x64"].dtype)
        return real_layout(batch, cast_float64)

    real_layout = _device._layout
    monkeypatch.setattr(_device, "_layout", layout)
    connector = DataConnector.from_arrow(mixed_table(1000))
    plain = [{k: v.clone() for k, v in b.items()} for b in connector.to_torch_dataset(**options)]
    ours = list(connector.to_torch_dataset(**options, device="cpu"))
    # cast in the staging copy unless shuffling copies the rows anyway
    assert arrived == {torch.float32 if options.get("shuffle") else torch.float64}
    want = torch.float64 if options.get("cast_float64") is False else torch.float32
    assert {t.dtype for t in plain[0].values() if t.is_floating_point()} == {want, torch.float32}
    for got, expected in zip(ours, plain, strict=True):  # NaN where a value was null
        assert list(got) == list(expected)
        for name in expected:
            assert got[name].dtype == expected[name].dtype
            assert torch.equal(got[name].nan_to_num(7.5), expected[name].nan_to_num(7.5))
            assert torch.equal(got[name].isnan(), expected[name].isnan())


def test_columns_of_one_dtype_share_a_tensor_and_each_starts_aligned() -> None:
    stager = DeviceStager(torch.device("cpu"), cast_float64=True)
    batch = {"a": torch.rand(7), "b": torch.rand(7, 3).double(), "c": torch.arange(7),
             "d": torch.rand(7)}
    (got,) = list(stager.batches(iter([batch])))
    assert got["a"].untyped_storage().data_ptr() == got["b"].untyped_storage().data_ptr()
    assert all(t.data_ptr() % ALIGN_BYTES == 0 for t in got.values())
    assert list(got) == list(batch) and got["b"].shape == (7, 3)
    assert torch.equal(got["b"], batch["b"].float()) and torch.equal(got["d"], batch["d"])


def test_float64_is_cast_by_the_staging_copy_only_where_asked() -> None:
    values = torch.tensor([0.1, 1 / 3, 1e-40, 3.4e38, 1e39, -2.5])
    for cast_float64, dtype in ((True, torch.float32), (False, torch.float64)):
        stager = DeviceStager(torch.device("cpu"), cast_float64=cast_float64)
        batch = {"x": values.double(), "i": torch.arange(6)}
        (got,) = list(stager.batches(iter([batch])))
        assert got["x"].dtype == dtype and got["i"].dtype == torch.int64
        assert torch.equal(got["x"], batch["x"].to(dtype))
        assert torch.equal(got["i"], batch["i"])


def test_staging_buffers_are_reused_and_handed_out_batches_stay_intact() -> None:
    stager = DeviceStager(torch.device("cpu"))
    batches = [{"a": torch.full((8, 2), float(i)), "b": torch.arange(8) + i} for i in range(7)]
    out = list(stager.batches(iter(batches)))
    assert_same(out, batches)
    assert set(stager.slots[0].buffers) == {torch.float32, torch.int64}  # one per dtype
    first = stager.slots[0].buffers[torch.float32]
    again = list(stager.batches(iter(batches[:RING])))
    assert stager.slots[0].buffers[torch.float32] is first  # big enough: reused
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
