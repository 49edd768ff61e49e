"""The interface of a Group Generator mode, and what the modes that form groups on request share."""

from __future__ import annotations

import random

from hetrain.protocols.ledger import Group, GroupLedger


class GroupingMode:
    """Who forms a group when a worker asks: one subclass per ``--gg`` mode.

    A mode works on the Group Generator's ``ledger`` (global order, queues, who
    is busy or gone) and draws from its ``rng``; the Group Generator checks the
    request, counts it and passes the worker's request number ``step``.
    ``request`` returns the groups the worker runs now, in order (empty: no
    sync this iteration); ``empty_requests`` counts the answers that were empty.
    """

    name = ""

    def __init__(self, ledger: GroupLedger, rng: random.Random, group_size: int):
        self.ledger = ledger
        self.rng = rng
        self.group_size = group_size
        self.empty_requests = 0

    @classmethod
    def create(cls, ledger: GroupLedger, rng: random.Random, group_size: int, *, seed: int = 0,
               workers_per_node: int | None = None) -> GroupingMode:
        """The mode for a Group Generator; ``seed`` and ``workers_per_node`` matter to the static schedule only."""
        return cls(ledger, rng, group_size)

    @classmethod
    def check_settings(cls, num_workers: int, group_size: int, workers_per_node: int | None) -> None:
        """Raise OptionError for settings this mode cannot work with (the generic ones are checked already)."""

    # -- the interface ----------------------------------------------------------------
    def request(self, worker: int, step: int, now_s: float) -> list[Group]:
        raise NotImplementedError

    def leave(self, worker: int, now_s: float) -> list[Group]:
        """``worker`` stopped training: it is never grouped again; return the groups it still owes."""
        return self.ledger.leave(worker)

    def rejoin(self, worker: int, incarnation: int) -> None:
        """A replacement for ``worker`` joined (see :meth:`GroupLedger.rejoin`)."""
        self.ledger.rejoin(worker, incarnation)

    @property
    def period(self) -> int:
        """Steps of a precomputed schedule's cycle (0: groups are formed on request)."""
        return 0

    def compute_estimate(self, worker: int) -> float | None:
        """What the mode has learnt of ``worker``'s compute time (None: nothing, or it learns none)."""
        return None

    def adopt_compute_estimate(self, worker: int, estimate: float) -> None:
        """Start from ``estimate`` for ``worker`` if nothing is learnt yet (a worker moving between generators)."""

    # -- shared by the modes --------------------------------------------------------------
    def _empty(self) -> list[Group]:
        self.empty_requests += 1
        return []

    def _form(self, worker: int, partners: list[int]) -> Group | None:
        """Assign a group of ``worker`` and ``partners`` (none when there are no partners)."""
        return self.ledger.assign([worker, *partners]) if partners else None

    def _random_partners(self, worker: int) -> list[int]:
        """Up to s-1 workers still training, drawn at random (busy ones included)."""
        others = self.ledger.available_except(worker)
        return self.rng.sample(others, min(self.group_size - 1, len(others)))
