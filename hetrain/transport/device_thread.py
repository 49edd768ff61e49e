"""Running on the worker's GPU without waiting on its compute stream or on the whole device.

CUDA's current device and current stream belong to each host thread: a thread starts on GPU 0 and on
that GPU's default stream, the one the model computes on. A helper thread (a receiver, a send reaper,
a background average, a watched call) that waited for NCCL there would make the model's next kernels
wait for the transfer: ``WorkNCCL::wait`` orders the *caller's current stream* after the NCCL kernel.

- :func:`device_thread` starts a daemon thread on the worker's GPU with a CUDA stream of its own:
  the stream first waits for what the caller had queued (an event recorded at the fork, so tensors the
  caller produced are ready), the target runs with it current, and the thread synchronizes it before it
  ends (what the thread produced is complete once the thread is joined).
- :func:`wait_work` waits for a collective's or a send's work: gloo's with its timeout; a CUDA
  stream's (NCCL's) by polling ``is_completed()`` until the timeout, then ``wait()``, which only orders
  the calling thread's current stream (its own, on a helper thread): no busy wait inside NCCL, no
  order on the compute stream from a helper.
- :func:`synchronize` waits for the calling thread's current stream (the compute stream on the main
  thread), never for the device: a timer around a step counts the step's kernels, not those of
  NCCL's or a helper's streams (docs/decisions/gpu-path.md).

On the CPU every function here is a plain thread, a plain wait, or a no-op.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable

import torch

POLL_FIRST_S = 0.0001  # polling a stream's work: first pause, doubled up to
POLL_MAX_S = 0.002


def on_device(device: torch.device | None) -> None:
    """Make ``device`` this thread's current CUDA device (a no-op for the CPU or None)."""
    if device is not None and device.type == "cuda":
        torch.cuda.set_device(device)


def synchronize(device: torch.device | None) -> None:
    """Wait for the kernels queued on this thread's current stream of ``device`` (a no-op on the CPU).

    On the main thread that is the compute stream: the step's kernels, not NCCL's or a helper thread's
    (a device-wide ``torch.cuda.synchronize`` would wait for those too). On a helper thread of
    :func:`device_thread`, its own stream."""
    if device is not None and device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def device_thread(target: Callable, *, name: str, device: torch.device | None, args: tuple = ()) -> threading.Thread:
    """A started daemon thread running ``target(*args)`` on ``device`` with a CUDA stream of its own
    (see the module docstring); a plain thread for the CPU or None."""
    if device is None or device.type != "cuda":
        thread = threading.Thread(target=target, args=args, daemon=True, name=name)
        thread.start()
        return thread
    fork = torch.cuda.Event()
    fork.record(torch.cuda.current_stream(device))  # what the caller queued before the fork

    def run() -> None:
        torch.cuda.set_device(device)
        own = torch.cuda.Stream(device)
        with torch.cuda.stream(own):
            own.wait_event(fork)
            try:
                target(*args)
            finally:
                own.synchronize()  # what the thread queued is done once it is joined

    thread = threading.Thread(target=run, daemon=True, name=name)
    thread.start()
    return thread


def wait_work(work, timeout: datetime.timedelta | float, on_stream: bool, what: str = "a transfer") -> None:
    """Wait for ``work`` at most ``timeout``; ``on_stream``: the work runs on a CUDA stream (NCCL's).

    gloo's work: ``work.wait(timeout)``. A stream's: ``is_completed()`` polled (pauses of 0.1-2 ms) until
    the timeout, then ``work.wait()``, which orders only this thread's current stream after it. A work
    not completed in time raises RuntimeError("timed out after N s waiting for <what>")."""
    timeout_s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    if not on_stream:
        work.wait(datetime.timedelta(seconds=timeout_s))
        return
    deadline = time.monotonic() + timeout_s
    pause = POLL_FIRST_S
    while not work.is_completed():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(min(pause, remaining))
        pause = min(2 * pause, POLL_MAX_S)
    work.wait()  # completed: orders this thread's stream after it (and raises the work's error, if any)


class StreamWork:
    """A CUDA stream's work (NCCL's) whose ``wait(timeout)`` is :func:`wait_work`'s: callers written for
    gloo's works (``work.wait(timeout)``) wait for it without blocking inside NCCL or ordering the
    compute stream from a helper thread."""

    def __init__(self, work, what: str = "a transfer"):
        self.work = work
        self.what = what

    def is_completed(self) -> bool:
        return self.work.is_completed()

    def wait(self, timeout: datetime.timedelta | float | None = None) -> bool:
        if timeout is None:
            return self.work.wait()
        wait_work(self.work, timeout, True, self.what)
        return True
