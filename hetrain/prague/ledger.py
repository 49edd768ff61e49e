"""The bookkeeping every group scheduler shares: global order, queues, communicator ids.

Pure logic, no I/O. A scheduler (a Group Generator mode, AD-PSGD's pairing)
decides *who* forms a group; the :class:`GroupLedger` gives the group its place
in the one global order, queues it for each member, decides its communicator id
and tracks which groups are still open. Workers execute their groups in
increasing ``seq``; because every group has one place in one order, a wait
chain always points to a group of lower ``seq`` and can never close a cycle.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from hetrain.prague.comm_lru import CommunicatorLRU


@dataclass(frozen=True)
class Group:
    """One P-Reduce to run: ``members`` (sorted ranks) average their models.

    ``seq`` is the group's place in the global order (execute in increasing
    ``seq``); ``comm_id`` names the communicator to use (equal to ``seq`` of the
    group that created it), identical on every member.
    """

    seq: int
    members: tuple[int, ...]
    comm_id: int

    def as_list(self) -> list:
        return [self.seq, list(self.members), self.comm_id]

    @classmethod
    def from_list(cls, data) -> Group:
        seq, members, comm_id = data
        return cls(int(seq), tuple(int(m) for m in members), int(comm_id))


class GroupLedger:
    """Global order, per-worker queues, open groups and communicator-cache models."""

    def __init__(self, num_workers: int, cache_size: int = 60):
        self.num_workers = num_workers
        self.cache_size = cache_size
        self.next_seq = 0
        self.queues: list[deque[Group]] = [deque() for _ in range(num_workers)]
        self.caches = [CommunicatorLRU(cache_size) for _ in range(num_workers)]
        self.left: set[int] = set()
        self._unstarted: dict[int, set[int]] = {}  # seq -> members that have not popped it yet
        self._groups: dict[int, Group] = {}
        self.groups_formed = 0
        self.members_total = 0

    def assign(self, members) -> Group:
        """Create a group of ``members`` (size >= 2) at the end of the order and queue it for each."""
        members = tuple(sorted(set(members)))
        if len(members) < 2:
            raise ValueError(f"a group needs at least two members, got {members}")
        seq = self.next_seq
        self.next_seq += 1
        ids = {self.caches[m].lookup(members) for m in members}
        comm_id = ids.pop() if len(ids) == 1 and None not in ids else seq
        for m in members:
            self.caches[m].use(members, comm_id)
        group = Group(seq, members, comm_id)
        for m in members:
            self.queues[m].append(group)
        self._unstarted[seq] = set(members)
        self._groups[seq] = group
        self.groups_formed += 1
        self.members_total += len(members)
        return group

    def pop(self, worker: int, count: int | None = None) -> list[Group]:
        """Hand ``worker`` its next ``count`` queued groups (all when None), in order."""
        queue = self.queues[worker]
        taken = []
        while queue and (count is None or len(taken) < count):
            group = queue.popleft()
            waiting = self._unstarted[group.seq]
            waiting.discard(worker)
            if not waiting:
                del self._unstarted[group.seq]
                del self._groups[group.seq]
            taken.append(group)
        return taken

    def leave(self, worker: int) -> list[Group]:
        """``worker`` stops training: no new group will include it; return what it still owes."""
        self.left.add(worker)
        return self.pop(worker)

    def open_groups(self) -> list[Group]:
        """Groups some member has not started yet, in order."""
        return [self._groups[seq] for seq in sorted(self._unstarted)]

    def busy(self) -> set[int]:
        """Workers that belong to an open group (started or not)."""
        return {m for group in self._groups.values() for m in group.members}

    def not_started(self, seq: int) -> list[int]:
        """Members that have not yet been handed group ``seq`` (empty when all have)."""
        return sorted(self._unstarted.get(seq, ()))

    def available(self) -> list[int]:
        return [w for w in range(self.num_workers) if w not in self.left]
