"""Flat buffers recycled instead of allocated every step.

A 25M-parameter model is a 100 MB flat buffer. Allocated fresh for every
gather, every mix and every received update, each one is a new ``mmap``
(glibc serves nothing that large from its heap) whose 25,600 pages the kernel
zero-fills on first touch and unmaps on free: measured on D-PSGD at 4 workers,
60% of all CPU time was kernel time at 400-500k page faults/s
(docs/results/2026-12-01-soak.md).

:class:`BufferPool` keeps the buffers and hands out views of them. A buffer is
free again once nothing but the pool refers to its storage (the storage's use
count), so callers hold and drop a buffer as they would any tensor: a queue
that keeps it, a send still reading it, a view of a slice of it all keep it
busy, and no caller has to give it back. At most ``capacity`` buffers are
kept, of which at most ``spare`` idle ones survive a take (a burst of
buffers in use does not stay resident after it); beyond ``capacity`` a take
allocates a plain tensor. So memory follows the buffers in use (plus
``spare``), and ``capacity`` only bounds the scan: it must exceed what a
protocol holds at once, or the excess is allocated fresh every step (a Hop
worker that fell behind holds up to in-degree x max_ig queued models, and
with a capacity of 8 the allocations slowed it further behind).

    pool = BufferPool(numel, torch.float32, torch.device("cpu"))
    buf = pool.take()         # uninitialised, shares memory with nothing in use
    ...                       # use it, send it, queue it; drop it when done

``pin_memory=True`` keeps page-locked host buffers (:mod:`hetrain.transport.staging`: a GPU's copies to
and from them run asynchronously and at full speed; allocating one is slow, so they are worth keeping).
"""

from __future__ import annotations

import threading

import torch

DEFAULT_CAPACITY = 32  # about 0.2 us per kept buffer per take; Hop at 8 workers held up to 12 queued models
DEFAULT_SPARE = 1

_use_count = getattr(torch._C, "_storage_Use_Count", None)  # private; without it the pool allocates plainly


def _storage_refs(tensor: torch.Tensor) -> int:
    return _use_count(tensor.untyped_storage()._cdata)


class BufferPool:
    """Uninitialised 1-D buffers of ``numel`` elements, reused once no tensor outside the pool uses them."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device, *,
                 capacity: int = DEFAULT_CAPACITY, spare: int = DEFAULT_SPARE, pin_memory: bool = False):
        if capacity < 0 or spare < 0:
            raise ValueError(f"capacity and spare must be >= 0, got {capacity} and {spare}")
        self.numel = numel
        self.dtype = dtype
        self.device = device
        self.capacity = capacity if _use_count is not None else 0
        self.spare = spare
        self.pin_memory = pin_memory  # page-locked host buffers (staging GPU payloads; needs CUDA)
        self.reused = 0  # takes served by a kept buffer
        self.allocated = 0  # takes that allocated
        self._kept: list[tuple[torch.Tensor, int]] = []  # (buffer, its storage's use count when idle)
        self._lock = threading.Lock()

    def take(self) -> torch.Tensor:
        """A buffer no one else uses (contents undefined); it returns to the pool when its last user drops it."""
        with self._lock:
            idle = [i for i, (buffer, refs) in enumerate(self._kept) if _storage_refs(buffer) == refs]
            if idle:
                for i in reversed(idle[1 + self.spare:]):  # idle beyond the spares: let them go
                    del self._kept[i]
                self.reused += 1
                return self._kept[idle[0]][0].view(-1)
            self.allocated += 1
            buffer = torch.empty(self.numel, dtype=self.dtype, device=self.device, pin_memory=self.pin_memory)
            if len(self._kept) < self.capacity:
                self._kept.append((buffer, _storage_refs(buffer)))
                return buffer.view(-1)
            return buffer

    @property
    def kept(self) -> int:
        """Buffers the pool holds now (in use or idle)."""
        with self._lock:
            return len(self._kept)
