"""Each worker's step time, shared through the job's c10d store (``local_work="auto"``).

At every exchange a worker writes its running step time under its rank and,
at most every ``REFRESH_S`` seconds, reads everyone's (one ``multi_get`` once all
have written; before that, those that have). The fastest step time sets how
many local steps each worker takes (:func:`hetrain.comm.local_work.steps_per_exchange`).
The store is the control plane every job already has (torchrun's, or the local
launcher's): a few bytes per exchange, not charged to the emulated links.
"""

from __future__ import annotations

import time

import torch.distributed as dist

REFRESH_S = 0.5


class SpeedBoard:
    def __init__(self, job):
        self.rank = job.rank
        self.world_size = job.world_size
        self.store = dist.PrefixStore("speed/", job.store) if job.store is not None else None
        self._keys = [str(r) for r in range(job.world_size)]
        self._all_written = False
        self._known: dict[int, float] = {}
        self._read_at = 0.0

    def publish(self, step_s: float | None) -> None:
        if self.store is not None and step_s:
            self.store.set(str(self.rank), repr(float(step_s)))

    def times(self, own_step_s: float | None, exclude=()) -> list[float]:
        """The step times known of the workers not in ``exclude``, this one's (``own_step_s``) included;
        the store is read at most every ``REFRESH_S``."""
        now = time.monotonic()
        if self.store is not None and now - self._read_at >= REFRESH_S:
            self._read_at = now
            self._refresh()
        times = [t for r, t in self._known.items() if r not in exclude and r != self.rank]
        if own_step_s:
            times.append(own_step_s)
        return times

    def fastest(self, own_step_s: float | None, exclude=()) -> float | None:
        """The smallest step time known among the workers not in ``exclude`` (this one's included)."""
        return min(self.times(own_step_s, exclude), default=None)

    def _refresh(self) -> None:
        if not self._all_written:
            self._all_written = self.store.check(self._keys)
        keys = self._keys if self._all_written else [k for k in self._keys if self.store.check([k])]
        if keys:
            for key, value in zip(keys, self.store.multi_get(keys)):
                self._known[int(key)] = float(value)
