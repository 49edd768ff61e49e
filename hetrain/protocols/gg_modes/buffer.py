"""``--gg buffer`` (Group Buffer): take the oldest group others queued for the requester, else form one.

Only with an empty buffer does a request form a new random group. One group
per iteration, so a worker rarely waits for the GG or runs extra syncs.
"""

from __future__ import annotations

from hetrain.protocols.gg_modes.base import GroupingMode
from hetrain.protocols.ledger import Group


class BufferMode(GroupingMode):
    name = "buffer"

    def request(self, worker: int, step: int, now_s: float) -> list[Group]:
        if not self.ledger.queues[worker]:
            self._form(worker, self._random_partners(worker))
        return self.ledger.pop(worker, 1) or self._empty()
