"""Who died, for jobs that hetrain's launcher does not run (Lightning's, Accelerate's): heartbeats on the store.

``on_failure="continue"`` needs ``dead_workers()``: the ranks known dead. hetrain's
own launcher knows them from its child processes; elsewhere every rank bumps a
counter of its own on the job's c10d store every ``INTERVAL_S`` (from a thread,
so a rank that merely waits is alive) and watches the others' counters. A rank
whose counter has not moved for ``SILENCE_S`` is dead, for good (``on_death`` hears of
it: the rank that serves Prague's or AD-PSGD's Group Generator stops grouping it, as
hetrain's launcher does). The store lives
in one process (rank 0's under Lightning's launcher, torchrun's agent under
torchrun): if that process dies, the job ends.

Silence is counted only while the watcher itself runs: a watching thread that was held up
(a garbage collection, a C call holding the GIL, an oversubscribed CPU) restarts its clocks
instead of blaming the others for its own gap. A death is written to the store
(``dead/<rank>``), so every rank adopts it (one membership, not one per watcher), and a rank
that was declared dead while it was merely stalled learns it at its next beat: its
``dead_workers()`` then raises a :class:`~hetrain.errors.WorkerError` saying so, and it leaves
(the others go on without it) instead of waiting for a final average nobody will join.
"""

from __future__ import annotations

import logging
import threading
import time

from hetrain.errors import WorkerError
from hetrain.transport.membership import Membership

log = logging.getLogger(__name__)

INTERVAL_S = 0.2
SILENCE_S = 1.5  # below the bound for naming a lost peer dead (hetrain.transport.membership.CONFIRM_DEATH_S)


class StoreLiveness(Membership):
    def __init__(self, store, rank: int, world_size: int, timeout_s: float):
        self.on_death = None  # called with each rank found dead (from the watching thread)
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._dead: set[int] = set()
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (its counter, when it last moved)
        self._last_tick: float | None = None
        self.declared_dead_by: int | None = None  # set when another rank declared this one dead
        self._lock = threading.Lock()  # on_death is called once per death: set, or replayed by notify
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def start(cls, store, rank: int, world_size: int, timeout_s: float) -> StoreLiveness:
        if store is None:
            raise RuntimeError("on_failure='continue' needs the job's c10d store (torch.distributed initialised)")
        liveness = cls(store, rank, world_size, timeout_s)
        liveness.store.add(f"beat/{rank}", 1)
        liveness._thread = threading.Thread(target=liveness._run, name="hetrain-liveness", daemon=True)
        liveness._thread.start()
        return liveness

    def dead(self) -> set[int]:
        return self.dead_workers()

    def dead_workers(self) -> set[int]:
        """The ranks known dead; raises if this rank itself was declared dead (it must leave)."""
        if self.declared_dead_by is not None:
            raise WorkerError(f"worker {self.rank} was declared dead by worker {self.declared_dead_by}: its "
                              f"heartbeat was silent for more than {SILENCE_S} s (a stall); the others go on "
                              "without it, so it leaves the job")
        return set(self._dead)

    def notify(self, on_death) -> None:
        """Call ``on_death(rank)`` for each rank found dead from now on, and at once for those found so far."""
        with self._lock:
            self.on_death = on_death
            known = set(self._dead)
        for rank in sorted(known):
            _report(on_death, rank)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            try:
                self.tick(time.monotonic())
            except Exception:  # the store is gone: the job is ending (or its host died); nothing to report
                return

    def tick(self, now: float) -> None:
        """One beat and one look at the others (the thread calls it every INTERVAL_S; tests call it)."""
        self.store.add(f"beat/{self.rank}", 1)
        if self._last_tick is not None and now - self._last_tick > INTERVAL_S + SILENCE_S / 2:
            gap = now - self._last_tick  # this watcher was held up: its gap is nobody's silence
            self._seen = {peer: (value, since + gap) for peer, (value, since) in self._seen.items()}
        self._last_tick = now
        if self.declared_dead_by is None and self.store.check([f"dead/{self.rank}"]):
            self.declared_dead_by = int(self.store.get(f"dead/{self.rank}"))
        for peer in range(self.world_size):
            if peer == self.rank or peer in self._dead:
                continue
            if self.store.check([f"dead/{peer}"]):  # another watcher declared it: one membership
                self._declare(peer, write=False)
                continue
            value = self.store.add(f"beat/{peer}", 0)
            if value == 0:
                continue  # not started yet: only a rank that has beaten can fall silent
            last = self._seen.get(peer)
            if last is None or value != last[0]:
                self._seen[peer] = (value, now)
            elif now - last[1] > SILENCE_S:
                self._declare(peer, write=True)

    def _declare(self, peer: int, write: bool) -> None:
        if write:
            self.store.compare_set(f"dead/{peer}", "", str(self.rank))  # the first declaration stays
        with self._lock:
            self._dead.add(peer)
            on_death = self.on_death
        if on_death is not None:
            _report(on_death, peer)


def _report(on_death, rank: int) -> None:
    try:
        on_death(rank)
    except Exception as error:  # the callback's failure must not stop the heartbeat
        log.warning("liveness: reporting rank %d dead failed: %s", rank, error)
