"""Running on the worker's GPU: helper threads that select it, and timers that wait for its kernels.

CUDA's current device belongs to each host thread: a thread starts on GPU 0
whatever its process selected (``torch.cuda.set_device`` in the main thread).
A receiver, reaper or background-averaging thread of a worker on GPU 3 would
then allocate on GPU 0, and an NCCL wait would order work on GPU 0's stream.
:func:`device_thread` starts a daemon thread that selects the worker's device
first (nothing on a CPU worker). :func:`synchronize` waits for a GPU's queued
kernels, so that a timer measures kernels and not their launch: the protocols'
compute/wait split and the calibration call it at their boundaries
(docs/decisions.md, "The GPU path").
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch


def on_device(device: torch.device | None) -> None:
    """Make ``device`` this thread's current CUDA device (a no-op for the CPU or None)."""
    if device is not None and device.type == "cuda":
        torch.cuda.set_device(device)


def synchronize(device: torch.device | None) -> None:
    """Wait for ``device``'s queued kernels (a no-op on the CPU): a timer around GPU work that does not
    synchronize times the kernels' launch, not the kernels."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def device_thread(target: Callable, *, name: str, device: torch.device | None, args: tuple = ()) -> threading.Thread:
    """A started daemon thread running ``target(*args)`` with ``device`` as its current CUDA device."""
    def run() -> None:
        on_device(device)
        target(*args)

    thread = threading.Thread(target=run, daemon=True, name=name)
    thread.start()
    return thread
