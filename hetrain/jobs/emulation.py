"""Emulated compute: make each iteration's compute phase last the time the slowdown spec says.

With ``--compute-ms T`` a worker of slowdown factor f should compute for T*f per iteration. The
real work runs first (taking the batch, zeroing gradients, forward, backward, the optimizer step),
timed in that very iteration; then the worker sleeps for the rest of the target. Nothing is
calibrated once: a start-up calibration read on a busy machine (78 ms of forward/backward against a
50 ms target) made a worker never sleep again once its math took a few ms, and the run's
heterogeneity efficiency read 2.34 (docs/decisions/emulation-measured-each-iteration.md).

A protocol whose backward pass holds communication (DDP's all-reduce) says how long it waited there
(``excluded_s``): that is not compute, so it is left out of the work the sleep completes. The
sleep's own overshoot (the kernel wakes late, more so on busy cores) is taken off the next requests
as the median of the recent overshoots, at most :data:`MAX_COMPENSATION` of the target, so one
late wake-up cannot shorten the phases after it by much.

Every iteration's target, achieved phase and real work go into a
:class:`~hetrain.jobs.compute_ledger.ComputeLedger`, which the record reports per worker.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable

from hetrain.jobs.compute_ledger import ComputeLedger

OVERSHOOT_WINDOW = 16  # recent sleeps whose median overshoot the next request subtracts
MAX_COMPENSATION = 0.05  # of the target: the most a request is shortened for the sleeps' overshoot


class ComputeEmulator:
    """``begin()`` before the iteration's work; ``end(target_s)`` after it: sleep for the rest of the target.

    ``clock`` and ``sleep`` are injectable (tests drive them by hand)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
                 ledger: ComputeLedger | None = None):
        self.clock = clock
        self._sleep = sleep
        self.ledger = ledger if ledger is not None else ComputeLedger()
        self._overshoots: deque[float] = deque(maxlen=OVERSHOOT_WINDOW)
        self._began: float | None = None

    def begin(self) -> None:
        """The iteration's work starts now."""
        self._began = self.clock()

    def end(self, target_s: float | None, factor: float = 1.0, excluded_s: float = 0.0) -> float:
        """The work is done: sleep so that work + sleep lasts ``target_s * factor``; return the phase's seconds.

        ``target_s`` None: real compute, the target is this iteration's own work times ``factor`` (a
        straggler of factor f sleeps f - 1 times its work). ``excluded_s``: seconds of the work that were
        the protocol's waiting inside backward (DDP), not compute. No sleep if the work alone is longer.
        """
        if self._began is None:
            raise RuntimeError("ComputeEmulator.end() without begin()")
        work_s = max(0.0, self.clock() - self._began - excluded_s)
        self._began = None
        target = (work_s if target_s is None else target_s) * factor
        request = target - work_s - self._compensation_s(target)
        slept = 0.0
        if request > 0:
            fell_asleep = self.clock()
            self._sleep(request)
            slept = self.clock() - fell_asleep
            self._overshoots.append(slept - request)
        achieved = work_s + slept
        self.ledger.record(target, achieved, work_s)
        return achieved

    def _compensation_s(self, target_s: float) -> float:
        if not self._overshoots:
            return 0.0
        return min(max(0.0, statistics.median(self._overshoots)), MAX_COMPENSATION * target_s)
