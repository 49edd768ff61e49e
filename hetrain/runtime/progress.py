"""Progress beacons: how a finishing worker tells a straggler still training from one that hangs.

Ranks stop at different times (a static shard, Lightning's ``max_steps`` or EarlyStopping per rank,
a user's fixed-length loop on unequal ranks): a rank that is done may have to wait minutes for a
slow one to reach the final average. A fixed bound (the job's timeout) either fails such a job
after all its training is done or waits that long for a rank that hangs. So each worker writes its
step count under its rank on the job's store, at most every :data:`BEAT_S` seconds (one store
``set``; no cost on the step's hot path between beats), and a finishing worker waits for the others
as long as one it waits for still moves its count: it gives up, naming the ranks, only when none
of them made a step for the job's timeout. (The timeout is then a bound on one step of the slowest
rank, not on how far apart the ranks end; a straggler spending longer than that without a step,
in a long validation for instance, needs a larger ``timeout_s``.)

Arrival: a worker entering the final average writes ``finished/<rank>`` and waits until every
rank not known dead has, which takes the wait out of the collective (whose own timeout is the
process group's fixed one). There an arrival counts as progress too: the ranks still missing may
have waited for the one that just arrived (Hop's neighbours of a straggler wait for its STOP).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch.distributed as dist

from hetrain.errors import WorkerError

BEAT_S = 1.0    # at most one store write per second per worker
POLL_S = 0.05   # how often a waiting worker looks


class ProgressBeacon:
    """One worker's step count on the store, and the wait for the others' arrival at the end."""

    def __init__(self, store, rank: int, world_size: int, timeout_s: float):
        self.store = dist.PrefixStore("progress/", store)
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.beat_s = min(BEAT_S, timeout_s / 4)  # several beats within any timeout
        self._last_beat = float("-inf")
        self._seen: dict[int, tuple[bytes, float]] = {}  # rank -> (its count, when this worker saw it change)

    @classmethod
    def of(cls, job) -> ProgressBeacon | None:
        """A beacon on ``job``'s store namespace (None with one worker or no store)."""
        if job.store is None or job.world_size < 2:
            return None
        return cls(job.store, job.rank, job.world_size, job.timeout_s)

    def beat(self, steps: int, *, now_or_never: bool = False) -> None:
        """Record ``steps`` (throttled: one write every ``beat_s``, BEAT_S or a quarter of the timeout);
        ``now_or_never``: write it now (the last count, as the worker finishes: the others read it)."""
        now = time.monotonic()
        if now_or_never or now - self._last_beat >= self.beat_s:
            self._last_beat = now
            self.store.set(f"steps/{self.rank}", str(steps))

    def progressing(self, peer: int) -> bool:
        """Whether ``peer`` moved its step count within the timeout, as far as this worker has looked
        (the first look counts as a move)."""
        key = f"steps/{peer}"
        value = self.store.get(key) if self.store.check([key]) else b""
        now = time.monotonic()
        seen = self._seen.get(peer)
        if seen is None or seen[0] != value:
            self._seen[peer] = (value, now)
            return True
        return now - seen[1] <= self.timeout_s

    def last_steps(self, peer: int) -> str:
        seen = self._seen.get(peer)
        return seen[0].decode() if seen and seen[0] else "none yet"

    @staticmethod
    def _someone_arrived(missing: list[int], before: list[int] | None) -> bool:
        return before is not None and len(missing) < len(before)

    def wait_for_arrivals(self, dead_workers: Callable[[], set[int]] | None, what: str,
                          last: int | None = None) -> None:
        """Say this worker reached ``what``, then wait until every rank not known dead has too, for as
        long as one of those still missing makes progress (one may be waiting for another).

        ``last``: a rank that arrives only once every other has (the parameter server, which takes no
        steps while it serves the last of them): once it is the only one missing and takes no steps, it
        is waited for ``timeout_s`` more (it may still be a straggler itself: then while it steps)."""
        self.store.set(f"finished/{self.rank}", "1")
        alone_since = None
        last_missing, arrival_seen = None, float("-inf")
        while True:
            dead = set(dead_workers()) if dead_workers is not None else set()
            missing = [r for r in range(self.world_size)
                       if r != self.rank and r not in dead and not self.store.check([f"finished/{r}"])]
            if not missing:
                return
            if self._someone_arrived(missing, last_missing):
                arrival_seen = time.monotonic()  # an arrival is progress: those still missing may have waited on it
            last_missing = missing
            if missing == [last] and not self.progressing(last):  # the others have arrived; it serves them
                alone_since = alone_since if alone_since is not None else time.monotonic()
                if time.monotonic() - alone_since > self.timeout_s:
                    raise WorkerError(f"worker {self.rank} waited {self.timeout_s:.0f} s for worker {last} to "
                                      f"reach {what} after every other worker had")
                time.sleep(POLL_S)
                continue
            alone_since = None
            moving = [peer for peer in missing if self.progressing(peer)]  # every one looked at
            # one still missing may be waiting for another: for one still stepping (the parameter server), or for
            # one that just arrived (a neighbour's STOP: Hop's join); all stuck only when nothing moved
            if not moving and time.monotonic() - arrival_seen > self.timeout_s:
                steps = ", ".join(f"worker {p} at step {self.last_steps(p)}" for p in missing)
                raise WorkerError(f"worker {self.rank} waited for workers {missing} to reach {what}: none made a "
                                  f"step, and no other worker arrived, for {self.timeout_s:.0f} s ({steps}); raise "
                                  "timeout_s if a rank spends longer than that between steps")
            time.sleep(POLL_S)
