"""Each worker's batches per second, shared through the job's c10d store (``--data-split balanced``).

Every ``REFRESH_S`` a worker writes how many batches it has computed under its
rank and reads everyone's count (one ``multi_get`` once all have written). A
worker's rate is the growth of its count over a window of the reader's own
clock, so no two machines' clocks are compared: the newest window of at least
``WINDOW_S`` in which the fastest worker computed at least ``MIN_BATCHES``
batches (a count of a few batches is too coarse a rate: with steps of seconds,
one batch more or less reads as a worker twice as fast). Until there is one,
no rates. A worker that died, or waits in its protocol, stops counting and
reads as slow. A replacement starts its count again from 0: its rate reads 0
until the window has passed the restart. The store is the control plane every job has (torchrun's, the local
launcher's, Ray's); a few bytes per worker every half second.
"""

from __future__ import annotations

import time
from collections import deque

import torch.distributed as dist

REFRESH_S = 0.5
WINDOW_S = 2.0  # at least; longer until the fastest worker has counted
MIN_BATCHES = 20  # so a rate is good to about 5% for the fastest (the dead band is 10%)
HISTORY = 1024  # counts kept at most (8.5 min at REFRESH_S; once a window is found, only from its start on):
# a job slower than MIN_BATCHES in that gets no rates


class RateBoard:
    def __init__(self, store, rank: int, world_size: int, refresh_s: float = REFRESH_S,
                 window_s: float = WINDOW_S, min_batches: int = MIN_BATCHES, clock=time.monotonic, dead=None):
        self.store = dist.PrefixStore("rate/", store) if store is not None else None
        self.rank = rank
        self._keys = [str(r) for r in range(world_size)]
        self._dead = dead  # ranks the launcher holds dead (None: none): one that never wrote counts 0
        self._written: set[int] = set()
        self._all_written = False
        self.refresh_s = refresh_s
        self.window_s = window_s
        self.min_batches = min_batches
        self.clock = clock
        self._at = None
        self._history: deque[tuple[float, list[int]]] = deque(maxlen=HISTORY)

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
        counts = self._counts()
        if counts is None:
            return None
        self._history.append((now, counts))
        for index in range(len(self._history) - 1, -1, -1):  # the newest window long enough and counted enough
            began, before = self._history[index]
            growth = [max(0, c - b) for c, b in zip(counts, before)]
            if now - began >= self.window_s and max(growth) >= self.min_batches:
                for _ in range(index):  # older starts are never needed again: counts only grow
                    self._history.popleft()
                return [g / (now - began) for g in growth]
        return None

    def _counts(self) -> list[int] | None:
        """Every rank's count (0 for a dead rank that never wrote one: vacant, or dead during start-up);
        None until every live rank has written."""
        if self._all_written:
            return [int(v) for v in self.store.multi_get(self._keys)]
        dead = set(self._dead()) if self._dead is not None else set()
        for r in range(len(self._keys)):
            if r not in self._written and self.store.check([self._keys[r]]):
                self._written.add(r)
        if len(self._written) == len(self._keys):
            self._all_written = True
            return self._counts()
        if any(r not in self._written and r not in dead for r in range(len(self._keys))):
            return None
        written = sorted(self._written)
        values = dict(zip(written, (int(v) for v in self.store.multi_get([self._keys[r] for r in written]))))
        return [values.get(r, 0) for r in range(len(self._keys))]
