"""Each worker's batches per second, shared through the job's c10d store (``--data-split balanced``).

Every ``REFRESH_S`` a worker writes how many batches it has computed under its
rank and reads everyone's count (one ``multi_get`` once all have written). A
worker's rate is the growth of its count over the last ``WINDOW_S`` of the
reader's own clock, so no two machines' clocks are compared; a worker that
died, or waits in its protocol, stops counting and reads as slow. A replacement
starts its count again from 0: its rate reads 0 until the window has passed the
restart. The store is the control plane every job has (torchrun's, the local
launcher's, Ray's); a few bytes per worker every half second.
"""

from __future__ import annotations

import time
from collections import deque

import torch.distributed as dist

REFRESH_S = 0.5
WINDOW_S = 4.0  # a worker 5x slower than 50 ms steps counts 16 batches in it


class RateBoard:
    def __init__(self, store, rank: int, world_size: int, refresh_s: float = REFRESH_S,
                 window_s: float = WINDOW_S, clock=time.monotonic):
        self.store = dist.PrefixStore("rate/", store) if store is not None else None
        self.rank = rank
        self._keys = [str(r) for r in range(world_size)]
        self._all_written = False
        self.refresh_s = refresh_s
        self.window_s = window_s
        self.clock = clock
        self._at = None
        self._history: deque[tuple[float, list[int]]] = deque()

    def note(self, computed: int) -> list[float] | None:
        """Publish this worker's count; every ``refresh_s``, the rates of all workers once a window is
        known (None before, and between refreshes)."""
        if self.store is None:
            return None
        now = self.clock()
        if self._at is not None and now - self._at < self.refresh_s:
            return None
        self._at = now
        self.store.set(str(self.rank), str(int(computed)))
        if not self._all_written:
            self._all_written = self.store.check(self._keys)
            if not self._all_written:
                return None
        counts = [int(v) for v in self.store.multi_get(self._keys)]
        self._history.append((now, counts))
        while len(self._history) > 2 and now - self._history[1][0] >= self.window_s:
            self._history.popleft()
        began, before = self._history[0]
        if now - began < 2 * self.refresh_s:  # a first estimate after two refreshes, then over the window
            return None
        span = now - began
        return [max(0, c - b) / span for c, b in zip(counts, before)]
