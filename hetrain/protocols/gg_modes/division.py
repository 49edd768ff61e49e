"""``--gg division`` (Group Division): groups inside divisions of s, reshuffled after each round.

Workers are split into divisions of s that are reshuffled after each round of
groups (as many groups as divisions); a group is formed inside the requester's
division and only from workers in no open group, so open groups never overlap.
"""

from __future__ import annotations

import random

from hetrain.protocols.gg_modes.base import GroupingMode
from hetrain.protocols.ledger import Group, GroupLedger


class DivisionMode(GroupingMode):
    name = "division"

    def __init__(self, ledger: GroupLedger, rng: random.Random, group_size: int):
        super().__init__(ledger, rng, group_size)
        self._divisions: list[list[int]] = []
        self._division_of: dict[int, int] = {}
        self._groups_since_shuffle = 0
        self._shuffle()

    def request(self, worker: int, step: int, now_s: float) -> list[Group]:
        if not self.ledger.queues[worker]:
            self._form(worker, self._partners(worker))
        return self.ledger.pop(worker, 1) or self._empty()

    def divisions(self) -> list[list[int]]:
        """The current divisions (a copy)."""
        return [list(d) for d in self._divisions]

    def _form(self, worker: int, partners: list[int]) -> Group | None:
        group = super()._form(worker, partners)
        if group is not None:
            self._groups_since_shuffle += 1
            if self._groups_since_shuffle >= len(self._divisions):
                self._shuffle()
        return group

    def _shuffle(self) -> None:
        n = self.ledger.num_workers
        perm = list(range(n))
        self.rng.shuffle(perm)
        s = self.group_size
        self._divisions = [perm[i : i + s] for i in range(0, n, s)]
        self._division_of = {w: d for d, division in enumerate(self._divisions) for w in division}
        self._groups_since_shuffle = 0

    def _partners(self, worker: int) -> list[int]:
        busy = self.ledger.busy()
        if worker in busy:
            return []
        division = self._divisions[self._division_of[worker]]
        return [w for w in division if w != worker and w not in busy and w not in self.ledger.left]
