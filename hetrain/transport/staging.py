"""A GPU model's payloads through pinned host buffers, and hand-overs between a GPU's streams.

gloo's point-to-point reads host memory, so a GPU model's payload travels through the host (the
``shared`` and ``split`` data planes, :mod:`hetrain.transport.data_plane`). :class:`HostStaging` keeps
the host buffers in page-locked :class:`~hetrain.transport.buffer_pool.BufferPool` s, one per payload
shape (the model, a compressed difference), so no message allocates:

- sending (the main thread): :meth:`HostStaging.outgoing` copies the payload into a pooled host buffer
  on the compute stream and waits for that copy only (an event), so gloo reads a complete copy; the
  caller's send window holds the buffer until the send is reaped, and then it goes back to its pool.
- receiving (a receiver thread, on its own stream: :func:`~hetrain.transport.device_thread.device_thread`):
  :meth:`HostStaging.receive_buffer` gives a pooled host buffer to receive into, and
  :meth:`HostStaging.incoming` copies it into a device buffer on the receiver's stream, after the compute
  stream's queued work (a pooled device buffer may still be read by kernels the main thread queued
  before it dropped it), and waits for that copy: the host buffer may be reused, and the main thread
  may read the device buffer, as soon as it returns.

On the CPU (tests) the same calls copy plainly; the pools' reuse and the buffers' lifetimes are the same.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hetrain.transport.buffer_pool import DEFAULT_CAPACITY, BufferPool
from hetrain.transport.device_thread import synchronize

STAGING_SPARE = 4  # idle pinned buffers kept (pinning is slow: a model-sized one costs milliseconds)


def compute_stream(device: torch.device) -> torch.cuda.Stream | None:
    """The calling thread's current stream of ``device`` (called on the main thread: the compute stream);
    None on the CPU."""
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


def after_compute(compute: torch.cuda.Stream | None) -> None:
    """Order this thread's current stream after what ``compute`` has queued so far (before writing into
    a buffer the compute stream may still read); a no-op on the CPU."""
    if compute is not None:
        torch.cuda.current_stream(compute.device).wait_stream(compute)


class HostStaging:
    """Pooled host buffers (pinned on a GPU machine) between ``device`` and the host; see the module docstring."""

    def __init__(self, device: torch.device, *, capacity: int = DEFAULT_CAPACITY, spare: int = STAGING_SPARE):
        self.device = device
        self.gpu = device.type == "cuda"
        self.pinned = self.gpu and torch.cuda.is_available()
        self.capacity = capacity
        self.spare = spare
        self.compute = compute_stream(device)  # built on the main thread: the stream the model computes on
        self._pools: dict[tuple[int, torch.dtype], BufferPool] = {}
        self._device_pools: dict[tuple[int, torch.dtype], BufferPool] = {}

    def pool(self, numel: int, dtype: torch.dtype) -> BufferPool:
        """The host pool of buffers of ``numel`` ``dtype`` elements (made on first use)."""
        key = (numel, dtype)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = BufferPool(numel, dtype, torch.device("cpu"), capacity=self.capacity,
                                                 spare=self.spare, pin_memory=self.pinned)
        return pool

    def outgoing(self, payload: torch.Tensor) -> torch.Tensor:
        """A pooled host copy of ``payload``, complete when returned (on the caller's current stream)."""
        host = self.pool(payload.numel(), payload.dtype).take()
        host.copy_(payload.reshape(-1), non_blocking=self.pinned)
        if self.gpu:
            self._wait_for_copy()
        return host

    def receive_buffer(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A pooled host buffer to receive a payload of ``numel`` ``dtype`` elements into."""
        return self.pool(numel, dtype).take()

    def incoming(self, host: torch.Tensor, new_device_buffer: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
        """``host``'s contents in a device buffer (``new_device_buffer()``, default one from a pool of this
        shape), complete when returned: ``host`` may go back to its pool at once."""
        if new_device_buffer is not None:
            target = new_device_buffer()
        else:
            key = (host.numel(), host.dtype)
            pool = self._device_pools.get(key)
            if pool is None:
                pool = self._device_pools[key] = BufferPool(host.numel(), host.dtype, self.device,
                                                            capacity=self.capacity)
            target = pool.take()
        after_compute(self.compute)  # kernels queued before the main thread dropped a pooled buffer
        target.copy_(host, non_blocking=self.pinned)
        if self.gpu:
            synchronize(self.device)  # this thread's stream (a receiver's own): the copy, nothing else
        return target

    def _wait_for_copy(self) -> None:
        """Wait for the copy just queued on this thread's current stream (not for the device)."""
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))
        done.synchronize()

    @property
    def kept(self) -> int:
        """Host buffers the pools hold (in use or idle)."""
        return sum(pool.kept for pool in self._pools.values())
