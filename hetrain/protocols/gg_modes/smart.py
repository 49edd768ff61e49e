"""``--gg smart`` (heterogeneity-aware): partners are the workers expected to ask within the requester's window.

Like ``division``'s rule that a group takes only workers in no open group, but
the partners are drawn from the workers the GG expects to request within the
requester's own iteration time (it learns each worker's time between
requests), so a fast worker is not grouped with a straggler that is
mid-iteration, while the straggler, when it asks, is grouped with workers that
will soon be ready. Among the workers due in the window it takes its last
group's members only to fill places nobody else due can take (so pairs that
finish together do not re-form forever). A worker that got no group on n
requests in a row is given a random group (busy members allowed), so nobody
drifts alone.
"""

from __future__ import annotations

import heapq
import random

from hetrain.protocols.gg_modes.base import GroupingMode
from hetrain.protocols.ledger import Group, GroupLedger

EMA = 0.3  # weight of the newest compute time in the speed estimate
SMART_WINDOW = 0.05  # partners must be due within this fraction of the requester's compute time
SMART_MIN_WINDOW_S = 0.002  # never narrower than this (GG round-trip jitter; very short iterations)
SMART_PATIENCE = 3  # after this many empty requests in a row, wait up to one own compute time


class SmartMode(GroupingMode):
    """Learns each worker's compute time and groups the workers due soonest.

    Per worker: its compute-time estimate, when its current compute began (None
    while it syncs), and, for computing workers, a heap of (expected request
    time, worker) with lazy deletion (an entry is live while the worker's due
    time equals its time and the worker is in no open group).
    """

    name = "smart"

    def __init__(self, ledger: GroupLedger, rng: random.Random, group_size: int):
        super().__init__(ledger, rng, group_size)
        n = ledger.num_workers
        self._now_s = 0.0
        self._compute_s: list[float | None] = [None] * n
        self._started_s: list[float | None] = [None] * n  # first request: nothing measured
        self._due_s: list[float | None] = [None] * n
        self._due_heap: list[tuple[float, int]] = []
        self._last_group: list[tuple[int, ...]] = [()] * n  # prefer new partners (mixing)
        self._empty_streak = [0] * n
        ledger.on_close = self._group_closed

    # -- the interface ----------------------------------------------------------------
    def request(self, worker: int, step: int, now_s: float) -> list[Group]:
        self._now_s = now_s
        self._observe(worker, now_s)
        if not self.ledger.queues[worker]:
            partners = self._partners(worker, now_s)
            if not partners and self._empty_streak[worker] >= self.ledger.num_workers:
                partners = self._random_partners(worker)
            self._form(worker, partners)
        groups = self.ledger.pop(worker, 1)
        self._empty_streak[worker] = 0 if groups else self._empty_streak[worker] + 1
        if not groups:
            self._computing(worker, now_s)
        return groups or self._empty()

    def leave(self, worker: int, now_s: float) -> list[Group]:
        self._now_s = now_s
        self._due_s[worker] = None
        return super().leave(worker, now_s)

    def rejoin(self, worker: int, incarnation: int) -> None:
        self._compute_s[worker] = self._started_s[worker] = self._due_s[worker] = None
        self._last_group[worker] = ()
        super().rejoin(worker, incarnation)

    def compute_estimate(self, worker: int) -> float | None:
        return self._compute_s[worker]

    def adopt_compute_estimate(self, worker: int, estimate: float) -> None:
        if self._compute_s[worker] is None:
            self._compute_s[worker] = estimate

    # -- who is due soon ---------------------------------------------------------------
    def _form(self, worker: int, partners: list[int]) -> Group | None:
        group = super()._form(worker, partners)
        if group is not None:
            for m in group.members:
                self._last_group[m] = group.members
            for m in partners:
                self._due_s[m] = None  # in an open group now: not a candidate
        return group

    def _observe(self, worker: int, now_s: float) -> None:
        """``worker`` asks at ``now_s``: learn its compute time; it is no longer computing."""
        started = self._started_s[worker]
        if started is not None:
            dt = max(0.0, now_s - started)
            old = self._compute_s[worker]
            self._compute_s[worker] = dt if old is None else (1 - EMA) * old + EMA * dt
        self._started_s[worker] = None
        self._due_s[worker] = None

    def _computing(self, worker: int, now_s: float) -> None:
        """``worker`` starts computing at ``now_s``: it is due at now + its compute estimate."""
        self._started_s[worker] = now_s
        estimate = self._compute_s[worker]
        if estimate is None or worker in self.ledger.left:
            return
        due = now_s + estimate
        self._due_s[worker] = due
        heapq.heappush(self._due_heap, (due, worker))

    def _group_closed(self, group: Group) -> None:
        """The last member took ``group``: the P-Reduce runs now, then its members compute again."""
        for m in group.members:
            if not self.ledger.is_busy(m) and m not in self.ledger.left:
                self._computing(m, self._now_s)

    def _partners(self, worker: int, now_s: float) -> list[int]:
        """Up to s-1 workers in no open group that are due soonest, within the requester's window.

        Members of the requester's last group count only after everyone else
        due in the window (mixing: workers that averaged together finish together).

        The window is ``SMART_WINDOW`` of the requester's own compute time (one
        compute time after ``SMART_PATIENCE`` empty requests in a row), so the
        requester expects to wait at most that long for its partners (workers late
        by more than the window are passed over: they are slower than measured,
        e.g. a random slowdown hit them). A fast worker never
        waits for a straggler in mid-iteration, and a straggler, when it asks, is
        grouped with the fast workers about to ask. The soonest are taken from a
        heap of due times kept up to date, not by scanning all workers.
        """
        if self.ledger.is_busy(worker):
            return []
        own = self._compute_s[worker]
        if own is None:
            return []
        window = own if self._empty_streak[worker] >= SMART_PATIENCE else SMART_WINDOW * own
        window = max(window, SMART_MIN_WINDOW_S)
        horizon = now_s + window
        heap, due_s, ledger = self._due_heap, self._due_s, self.ledger
        chosen: list[int] = []
        passed: list[tuple[float, int]] = []  # entries looked at and not taken: back on the heap after
        repeats: list[tuple[float, int]] = []  # the requester's last partners: only if nobody else is due
        last = self._last_group[worker]
        while heap and len(chosen) < self.group_size - 1:
            due, w = heap[0]
            if due_s[w] != due or ledger.is_busy(w) or w in ledger.left or w == worker:
                heapq.heappop(heap)  # stale entry
                continue
            if due > horizon:
                break
            entry = heapq.heappop(heap)
            if due < now_s - window:  # late by more than the window: slower than measured, skip it
                passed.append(entry)
            elif w in last:
                repeats.append(entry)
            else:
                chosen.append(w)
        while repeats and len(chosen) < self.group_size - 1:
            chosen.append(repeats.pop(0)[1])
        for entry in passed + repeats:
            heapq.heappush(heap, entry)
        return chosen
