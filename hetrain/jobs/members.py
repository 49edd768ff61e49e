"""Who may be in a local job beyond its deaths: vacant ranks that new workers join, and graceful leaves.

A job that may grow (``max_workers``) holds ranks ``0..max_workers-1`` from its start; the ranks above
the starting size are *vacant*: dead to the others (their protocols route around them as around a
death) until a worker joins into one. Joins come on the training clock (``--join K@Ts``), into the
lowest vacant ranks. A worker asks to leave (SIGTERM to it alone, or ``sync.leave()``); the launcher
lets it go once the ask is ``LEAVE_GRACE_S`` old and no stop came meanwhile, so that a scheduler's
SIGTERM to every process of the job stays a stop. Once the worker that left has ended, its rank is
vacant again: a later join may take it (a new process, the rank's next incarnation). Records only: the
launcher (:class:`hetrain.jobs.local_job.LocalJob`) acts on them.
"""

from __future__ import annotations

import bisect
import time

LEAVE_GRACE_S = 0.5  # a SIGTERM to the whole job reaches the launcher within this of its workers


class Members:
    def __init__(self, num_ranks: int, start_workers: int, joins: list[tuple[float, int]] | None = None):
        if not 1 <= start_workers <= num_ranks:
            raise ValueError(f"start_workers must be in 1..{num_ranks}, got {start_workers}")
        self.num_ranks = num_ranks
        self.start_workers = start_workers
        self.vacant: list[int] = list(range(start_workers, num_ranks))  # lowest first
        self.fresh: set[int] = set()  # vacant ranks taken whose new member's process is not started yet
        self._joins = sorted(joins or [])
        self.pending: dict[int, tuple[int, float]] = {}  # rank -> (incarnation, when it asked to leave)
        self.leaving: dict[int, int] = {}  # rank -> incarnation let go (its end is a leave, not a death)
        self.left: list[dict] = []
        self.started_at = time.monotonic()

    def due(self, training_time_s: float | None) -> list[int]:
        """The vacant ranks whose joins are due at ``training_time_s`` (None: training has not begun), lowest
        first; they stop being vacant. A join due that finds no vacant rank waits for one (:meth:`waiting`)."""
        ranks = []
        while self._joins and self.vacant and training_time_s is not None and self._joins[0][0] <= training_time_s:
            at, count = self._joins.pop(0)
            if count > 1:
                self._joins.insert(0, (at, count - 1))
            ranks.append(self.vacant[0])
            self.take(self.vacant[0])
        return ranks

    def waiting(self, training_time_s: float | None) -> int:
        """Joins due at ``training_time_s`` that found no vacant rank (every rank has a worker)."""
        if training_time_s is None:
            return 0
        return sum(count for at, count in self._joins if at <= training_time_s)

    def take(self, rank: int) -> None:
        """A worker joins vacant ``rank`` now (due, or off the schedule: a Ray job's cluster has room for it)."""
        self.vacant.remove(rank)
        self.fresh.add(rank)

    def starting(self, rank: int) -> bool:
        """Whether the process starting into ``rank`` is a new member (it was taken vacant), not a dead
        worker's replacement."""
        new = rank in self.fresh
        self.fresh.discard(rank)
        return new

    def vacate(self, rank: int) -> None:
        """The worker let go from ``rank`` has ended: the rank is vacant again, for a later join."""
        if rank not in self.vacant:
            bisect.insort(self.vacant, rank)

    def count(self, dead_flags) -> int:
        """Members now: ranks not dead (vacant ranks read dead)."""
        return sum(1 for r in range(self.num_ranks) if not dead_flags[r])

    def wants_to_leave(self, rank: int, incarnation: int) -> None:
        self.pending.setdefault(rank, (incarnation, time.monotonic()))

    def ripe(self) -> list[tuple[int, int]]:
        """(rank, incarnation) of the asks older than ``LEAVE_GRACE_S``, taken off the pending list."""
        now = time.monotonic()
        ripe = [(rank, inc) for rank, (inc, asked) in self.pending.items() if now - asked >= LEAVE_GRACE_S]
        for rank, _ in ripe:
            del self.pending[rank]
        return ripe

    def let_go(self, rank: int, incarnation: int, training_time_s: float, last_report: dict) -> None:
        self.leaving[rank] = incarnation
        self.left.append({"rank": rank, "incarnation": incarnation, "t_s": round(training_time_s, 3),
                          "wall_s": round(time.monotonic() - self.started_at, 3),
                          "iteration": last_report.get("iteration", 0)})

    def is_leaving(self, rank: int, incarnation: int) -> bool:
        return self.leaving.get(rank) == incarnation

    def ended_without_result(self, rank: int) -> None:
        """A worker let go that exited before sending its result (killed while leaving): still a leave."""
        for record in self.left:
            if record["rank"] == rank and record["incarnation"] == self.leaving.get(rank):
                record["without_result"] = True
