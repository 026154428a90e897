"""Batches handed out already on a device: reused staging buffers, copies on a side stream.

Imported only once torch is (by the torch adapter). For a CUDA device each batch goes:

1. (CPU) the batch is made as on the CPU path, except that without shuffling float64 columns
   are left as they are (views of the Arrow data). It is then copied into a *pinned* host
   staging buffer reused from a small ring, so the host-to-device copy is never a pageable
   one. With ``cast_float64`` those float64 columns are cast to float32 in that copy: one
   pass over the data, not a cast into fresh memory and then a copy (the cast is IEEE
   rounding either way, so the values equal the CPU path's). Shuffling copies the rows
   anyway, so there the cast comes first and the permutation moves half the bytes; parquet
   sources cast while decoding, so their columns arrive as float32. The columns of one
   dtype lie side by side in one buffer;
2. (side stream) one ``non_blocking=True`` copy per dtype into a fresh device tensor, with
   an event recorded after it; the batch's columns are views of that tensor (a batch of 24
   float32 columns costs one allocation and one copy, not 24 of each);
3. the batch is handed out one step later: while the caller's step runs on the GPU, the next
   batch is decoded and its copy is already in flight. Before a batch is handed out the
   caller's stream waits for its event and the tensors are marked as used on that stream.

A staging buffer is written again only after the copy that last read it has finished (its
event). The same code path runs for a CPU device, without pinning, streams or events, so its
logic is exercised and its batches equal the plain CPU path's on any machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

TensorDict = dict[str, torch.Tensor]
Flats = dict[torch.dtype, torch.Tensor]
RING = 3  # staging buffers: one being filled, one being copied, one spare
ALIGN_BYTES = 64


@dataclass
class _Group:
    """The columns of one dtype, side by side in one flat tensor, in batch order. Each starts
    on an ``ALIGN_BYTES`` boundary, as a tensor of its own would (vectorised and compiled
    kernels expect aligned inputs)."""

    names: list[str] = field(default_factory=list)
    shapes: list[torch.Size] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # elements per column, padding included

    def add(self, name: str, shape: torch.Size, itemsize: int) -> None:
        step = max(1, ALIGN_BYTES // itemsize)
        self.names.append(name)
        self.shapes.append(shape)
        self.slots.append(-(-shape.numel() // step) * step)

    def views(self, flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """Each column's view of ``flat`` (one split for the group, not a slice each)."""
        for name, shape, slot, piece in zip(self.names, self.shapes, self.slots,
                                            flat.split(self.slots)):
            numel = shape.numel()
            if numel != slot:
                piece = piece[:numel]
            yield name, piece if len(shape) == 1 else piece.view(shape)


Layout = dict[torch.dtype, _Group]


def _layout(batch: TensorDict, cast_float64: bool) -> Layout:
    """Where each column goes: float64 ones as float32 with ``cast_float64``."""
    groups: Layout = {}
    for name, tensor in batch.items():
        cast = cast_float64 and tensor.dtype == torch.float64
        dtype = torch.float32 if cast else tensor.dtype
        groups.setdefault(dtype, _Group()).add(name, tensor.shape, dtype.itemsize)
    return groups


def _columns(batch: TensorDict, layout: Layout, flats: Flats) -> TensorDict:
    """The columns of ``batch``, in its order, as views of ``flats``."""
    views = {name: view for dtype, group in layout.items() for name, view in
             group.views(flats[dtype])}
    return {name: views[name] for name in batch}


@dataclass
class _Slot:
    """One flat staging buffer per dtype, and the event of the last copy that read them."""

    buffers: Flats = field(default_factory=dict)
    event: Any = None  # torch.cuda.Event on a CUDA device

    def staged(self, batch: TensorDict, layout: Layout, pin: bool) -> Flats:
        """Copy ``batch`` into this slot's buffers (grown as needed), as ``layout`` places
        it; returns the used part of each buffer."""
        flats = {}
        for dtype, group in layout.items():
            size = sum(group.slots)
            buffer = self.buffers.get(dtype)
            if buffer is None or buffer.numel() < size:
                buffer = torch.empty(size, dtype=dtype, pin_memory=pin)
                self.buffers[dtype] = buffer
            flats[dtype] = buffer[:size]
            for name, view in group.views(flats[dtype]):
                view.copy_(batch[name])
        return flats


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """The target device (``"cuda"`` means this process's current CUDA device), or None."""
    if device is None:
        return None
    target = torch.device(device)
    if target.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r}, but torch sees no CUDA device here "
                             "(CUDA_VISIBLE_DEVICES may hide it); use device=None for CPU "
                             "batches")
        if target.index is None:
            target = torch.device("cuda", torch.cuda.current_device())
    elif target.type != "cpu":
        raise ValueError(f"device={str(device)!r} is not supported; use 'cuda', 'cuda:N' or "
                         "'cpu'")
    return target


class DeviceStager:
    """Turns CPU batches into batches on ``device`` (see the module docstring); with
    ``cast_float64`` float64 tensors arrive on the device as float32."""

    def __init__(self, device: torch.device, cast_float64: bool = False) -> None:
        self.device = device
        self.cast_float64 = cast_float64
        self.cuda = device.type == "cuda"
        self.slots = [_Slot() for _ in range(RING)]
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._next = 0

    def _send(self, batch: TensorDict) -> tuple[TensorDict, Flats, Any]:
        """Stage ``batch`` and start its copy; returns the device tensors, the flat tensors
        they view, and the copy's event."""
        slot = self.slots[self._next]
        self._next = (self._next + 1) % RING
        if slot.event is not None:
            slot.event.synchronize()  # the copy that last read this buffer has finished
        layout = _layout(batch, self.cast_float64)
        staged = slot.staged(batch, layout, pin=self.cuda)
        if self.stream is None:
            moved = {dtype: flat.to(self.device, copy=True) for dtype, flat in staged.items()}
        else:
            with torch.cuda.stream(self.stream):
                moved = {dtype: torch.empty_like(flat, device=self.device)
                         for dtype, flat in staged.items()}
                for dtype, flat in staged.items():
                    moved[dtype].copy_(flat, non_blocking=True)
                slot.event = torch.cuda.Event()
                slot.event.record(self.stream)
        return _columns(batch, layout, moved), moved, slot.event

    def _ready(self, columns: TensorDict, moved: Flats, event: Any) -> TensorDict:
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for flat in moved.values():
                flat.record_stream(current)  # freed only after the caller's use of it
        return columns

    def batches(self, cpu_batches: Iterator[TensorDict]) -> Iterator[TensorDict]:
        """Each batch on the device, handed out once the next one's copy has started."""
        pending: tuple[TensorDict, Flats, Any] | None = None
        for batch in cpu_batches:
            sent = self._send(batch)
            if pending is not None:
                yield self._ready(*pending)
            pending = sent
        if pending is not None:
            yield self._ready(*pending)
