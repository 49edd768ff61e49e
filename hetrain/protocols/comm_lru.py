"""A bounded, least-recently-used record of which communicators a worker holds.

Pure bookkeeping (no torch.distributed): the same class runs inside
:class:`hetrain.groups.preduce.PReduce` on every worker and inside the Group
Generator, which keeps one copy per worker. Both see a worker's groups in the
same order (the GG's global order restricted to that worker), so they evict the
same entries at the same points, and the GG can tell every member of a new
group whether to reuse a communicator or create a fresh one.
"""

from __future__ import annotations

from collections import OrderedDict

Members = tuple[int, ...]


class CommunicatorLRU:
    """Member set -> communicator id, at most ``capacity`` entries.

    A communicator id names one creation of a communicator for a member set
    (the GG uses the sequence number of the group that created it). ``use``
    records that the set is needed with a given id: a hit when the entry holds
    that id, otherwise a miss that replaces the set's old entry (if any) and
    evicts least-recently-used entries to make room.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"communicator cache size must be >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[Members, int] = OrderedDict()

    def lookup(self, members: Members) -> int | None:
        return self._entries.get(members)

    def use(self, members: Members, comm_id: int) -> tuple[bool, list[tuple[Members, int]]]:
        """Record a use; return (hit, [(members, comm_id) evicted])."""
        old = self._entries.get(members)
        if old == comm_id:
            self._entries.move_to_end(members)
            return True, []
        evicted: list[tuple[Members, int]] = []
        if old is not None:
            del self._entries[members]
            evicted.append((members, old))
        while len(self._entries) >= self.capacity:
            evicted.append(self._entries.popitem(last=False))
        self._entries[members] = comm_id
        return False, evicted

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, members: Members) -> bool:
        return members in self._entries


def agree_comm_id(caches: list[CommunicatorLRU], members: Members, seq: int) -> int:
    """The communicator id a new group ``seq`` of ``members`` uses, recorded in each member's cache model.

    The set's cached id when every member still holds the same one (a hit
    everywhere), else ``seq``: a fresh communicator every member creates.
    """
    ids = {caches[m].lookup(members) for m in members}
    comm_id = ids.pop() if len(ids) == 1 and None not in ids else seq
    for m in members:
        caches[m].use(members, comm_id)
    return comm_id
