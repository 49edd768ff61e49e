"""Emulated compute: make each iteration's compute phase last the time the slowdown spec says.

With ``--compute-ms T`` a worker of slowdown factor f should compute for T*f
per iteration. It sleeps first and then does the real math (sleeping before
the forward pass is what makes this work for DDP, whose backward pass holds
the all-reduce). The phase also holds work that is neither sleep nor math:
the sleep's own overshoot, taking the batch, zeroing gradients, the optimizer
step. Unaccounted, that overhead made every worker slower than its standalone
speed, for every protocol alike (figures: docs/decisions.md, "Measuring"). :class:`ComputeEmulator` measures it each iteration and
shortens the next sleep by its running mean, so the phase lasts T*f on average.
The forward/backward time counts as its calibrated median, never as measured,
so a protocol's wait inside backward (DDP) is never hidden by a shorter sleep.
"""

from __future__ import annotations

import time

OVERHEAD_EMA = 0.1  # weight of the newest iteration in the running mean of the overhead


class ComputeEmulator:
    """``sleep(target_s)`` before the math; ``note_overhead(seconds)`` after the iteration's other work."""

    def __init__(self, math_s: float):
        self.math_s = math_s
        self.overhead_s = 0.0
        self._pending_s = 0.0  # overhead measured so far this iteration

    def sleep(self, target_s: float) -> None:
        """Sleep so that sleep + math + overhead adds up to ``target_s`` (no sleep if the math alone is longer)."""
        request = target_s - self.math_s - self.overhead_s
        if request <= 0:
            self._pending_s = 0.0
            return
        began = time.perf_counter()
        time.sleep(request)
        self._pending_s = time.perf_counter() - began - request  # the sleep's overshoot

    def note_overhead(self, seconds: float) -> None:
        """Add some of this iteration's non-math work (seconds)."""
        self._pending_s += seconds

    def end_iteration(self) -> None:
        """Fold this iteration's overhead into the running mean the next sleeps subtract."""
        self.overhead_s += OVERHEAD_EMA * (self._pending_s - self.overhead_s)
        self._pending_s = 0.0
