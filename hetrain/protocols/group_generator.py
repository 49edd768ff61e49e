"""Prague's Group Generator (GG) as pure logic: requests in, group assignments out.

No I/O, no clock, no process group: the caller passes the time of each request
(``now_s``), and everything random comes from one seeded generator, so the same
requests give the same groups. :mod:`hetrain.groups.gg_service` serves it to a
real job; a discrete-event simulator can call it directly.

Who forms a group on a request is the mode's (``--gg``, group size s among n
workers), one strategy object each in :mod:`hetrain.protocols.gg_modes`:
``random`` (every request forms a random group), ``buffer`` (take a group
others queued first), ``division`` (groups inside divisions of s, never
overlapping), ``static`` (a precomputed schedule each worker computes locally)
and ``smart`` (heterogeneity-aware: partners due within the requester's own
iteration time; the default).

Every group gets a place in one global order (:class:`~hetrain.protocols.ledger.Group`
``seq``); workers run their groups in that order, which rules out deadlock.
"""

from __future__ import annotations

import random

from hetrain.protocols.gg_modes import GG_MODES, MODES
from hetrain.protocols.gg_modes.static import StaticSchedule, static_schedule
from hetrain.protocols.ledger import Group, GroupLedger
from hetrain.protocols.options import OptionError

__all__ = ["GG_MODES", "GroupGenerator", "StaticSchedule", "static_schedule", "validate_gg"]


def validate_gg(num_workers: int, group_size: int, mode: str, cache_size: int = 60, workers_per_node=None):
    """Raise a one-line OptionError for a GG setting that cannot work."""
    if mode not in GG_MODES:
        raise OptionError(f"unknown {{gg}} mode {mode!r}; choose one of {', '.join(GG_MODES)}")
    if not 1 <= group_size <= num_workers:
        raise OptionError(
            f"{{group_size}} must be between 1 and the number of workers ({num_workers}), got {group_size}"
        )
    if cache_size < 1:
        raise OptionError(f"{{communicator_cache}} must be >= 1, got {cache_size}")
    if workers_per_node is not None and workers_per_node < 1:
        raise OptionError(f"{{workers_per_node}} must be >= 1, got {workers_per_node}")
    MODES[mode].check_settings(num_workers, group_size, workers_per_node)


class GroupGenerator:
    """The GG of one job. ``request(worker, now_s)`` returns the groups to run now, in order.

    ``leave(worker, now_s)`` marks a worker that stopped training: it is never
    put in a new group, and the groups already queued for it are returned so it
    can run them before it exits. An empty list means: no sync this iteration.

    ``first_seq``, ``caches`` and ``absent`` are those of its
    :class:`~hetrain.protocols.ledger.GroupLedger` (a shard's generator, see
    :mod:`hetrain.protocols.sharded_gg`).
    """

    def __init__(self, num_workers, group_size=2, mode="smart", *, seed=0, workers_per_node=None, cache_size=60,
                 first_seq: int = 0, caches=None, absent: bool = False):
        validate_gg(num_workers, group_size, mode, cache_size, workers_per_node)
        self.num_workers = num_workers
        self.group_size = group_size
        self.mode = mode
        self.rng = random.Random(seed)
        self.ledger = GroupLedger(num_workers, cache_size, first_seq=first_seq, caches=caches, absent=absent)
        self.requests = [0] * num_workers
        self.strategy = MODES[mode].create(self.ledger, self.rng, group_size, seed=seed,
                                           workers_per_node=workers_per_node)

    # -- requests ------------------------------------------------------------
    def request(self, worker: int, now_s: float = 0.0) -> list[Group]:
        if not 0 <= worker < self.num_workers:
            raise ValueError(f"worker {worker} out of range for {self.num_workers} workers")
        if worker in self.ledger.left:
            raise ValueError(f"worker {worker} asked for a group after leaving")
        step = self.requests[worker]
        self.requests[worker] += 1
        return self.strategy.request(worker, step, now_s)

    def leave(self, worker: int, now_s: float = 0.0) -> list[Group]:
        return self.strategy.leave(worker, now_s)

    def rejoin(self, worker: int, incarnation: int) -> None:
        """A replacement for ``worker`` joined (see :meth:`GroupLedger.rejoin`)."""
        self.strategy.rejoin(worker, incarnation)

    def arrive(self, worker: int) -> None:
        """``worker``, absent until now, may be grouped from now on (see :meth:`GroupLedger.arrive`)."""
        self.ledger.arrive(worker)

    def settle(self, worker: int) -> None:
        self.ledger.settle(worker)

    def left(self) -> frozenset[int]:
        """Workers that have left."""
        return frozenset(self.ledger.left)

    @property
    def period(self) -> int:
        """Steps of the static schedule's cycle (0 in the modes that form groups on request)."""
        return self.strategy.period

    @property
    def empty_requests(self) -> int:
        """Requests answered with no group."""
        return self.strategy.empty_requests

    def compute_estimate(self, worker: int) -> float | None:
        """The mode's estimate of ``worker``'s compute time (smart only; None otherwise)."""
        return self.strategy.compute_estimate(worker)

    def adopt_compute_estimate(self, worker: int, estimate: float) -> None:
        """Start from ``estimate`` for ``worker`` unless the mode has learnt one (smart only)."""
        self.strategy.adopt_compute_estimate(worker, estimate)

    def totals(self) -> dict:
        """Raw counters (groups formed, members summed over them, requests, empty answers) to add up."""
        return {"gg_groups_formed": self.ledger.groups_formed, "members": self.ledger.members_total,
                "gg_requests": sum(self.requests), "gg_empty_requests": self.empty_requests}

    def stats(self) -> dict:
        return {**self.ledger.stats(self.mode, sum(self.requests)), "gg_empty_requests": self.empty_requests}
