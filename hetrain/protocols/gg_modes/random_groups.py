"""``--gg random``: every request forms a new group, the requester plus s-1 workers drawn at random.

A worker runs every group queued for it (its own and those formed by others'
requests) before its next iteration.
"""

from __future__ import annotations

from hetrain.protocols.gg_modes.base import GroupingMode
from hetrain.protocols.ledger import Group


class RandomMode(GroupingMode):
    name = "random"

    def request(self, worker: int, step: int, now_s: float) -> list[Group]:
        self._form(worker, self._random_partners(worker))
        return self.ledger.pop(worker)  # an empty answer is not counted: nothing was there to wait for
