"""Batches handed out already on a device: reused staging buffers, copies on a side stream.

Imported only once torch is (by the torch adapter). For a CUDA device each batch goes:

1. (CPU) the batch is made as on the CPU path (float32 cast included), then copied into a
   *pinned* host staging buffer reused from a small ring, so the host-to-device copy is
   never a pageable one;
2. (side stream) one ``non_blocking=True`` copy per column into a fresh device tensor, with
   an event recorded after it;
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
RING = 3  # staging buffers: one being filled, one being copied, one spare


@dataclass
class _Slot:
    """One staging buffer per column, and the event of the last copy that read them."""

    buffers: TensorDict = field(default_factory=dict)
    event: Any = None  # torch.cuda.Event on a CUDA device

    def staged(self, batch: TensorDict, pin: bool) -> TensorDict:
        """Copy ``batch`` into this slot's buffers (grown or replaced as needed)."""
        views = {}
        for name, tensor in batch.items():
            buffer = self.buffers.get(name)
            if buffer is None or buffer.dtype != tensor.dtype or \
                    buffer.shape[1:] != tensor.shape[1:] or buffer.shape[0] < tensor.shape[0]:
                buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
                self.buffers[name] = buffer
            view = buffer[: tensor.shape[0]]
            view.copy_(tensor)
            views[name] = view
        return views


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
    """Turns CPU batches into batches on ``device`` (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.slots = [_Slot() for _ in range(RING)]
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._next = 0

    def _send(self, batch: TensorDict) -> tuple[TensorDict, Any]:
        """Stage ``batch`` and start its copy; returns the device tensors and their event."""
        slot = self.slots[self._next]
        self._next = (self._next + 1) % RING
        if slot.event is not None:
            slot.event.synchronize()  # the copy that last read this buffer has finished
        staged = slot.staged(batch, pin=self.cuda)
        if self.stream is None:
            return {name: view.to(self.device, copy=True) for name, view in staged.items()}, None
        with torch.cuda.stream(self.stream):
            moved = {name: torch.empty(view.shape, dtype=view.dtype, device=self.device)
                     for name, view in staged.items()}
            for name, view in staged.items():
                moved[name].copy_(view, non_blocking=True)
            slot.event = torch.cuda.Event()
            slot.event.record(self.stream)
        return moved, slot.event

    def _ready(self, moved: TensorDict, event: Any) -> TensorDict:
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for tensor in moved.values():
                tensor.record_stream(current)  # freed only after the caller's use of it
        return moved

    def batches(self, cpu_batches: Iterator[TensorDict]) -> Iterator[TensorDict]:
        """Each batch on the device, handed out once the next one's copy has started."""
        pending: tuple[TensorDict, Any] | None = None
        for batch in cpu_batches:
            sent = self._send(batch)
            if pending is not None:
                yield self._ready(*pending)
            pending = sent
        if pending is not None:
            yield self._ready(*pending)
