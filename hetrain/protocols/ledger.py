"""The bookkeeping every group scheduler shares: global order, queues, communicator ids.

Pure logic, no I/O. A scheduler (a Group Generator mode, AD-PSGD's pairing)
decides *who* forms a group; the :class:`GroupLedger` gives the group its place
in the one global order, queues it for each member, decides its communicator id
and tracks which groups are still open. Workers execute their groups in
increasing ``seq``; because every group has one place in one order, a wait
chain always points to a group of lower ``seq`` and can never close a cycle.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from hetrain.protocols.comm_lru import CommunicatorLRU, agree_comm_id


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
    fresh: tuple[int, ...] = ()  # replacements with no model yet: they take the others' average
    incarnations: tuple[int, ...] = ()  # each member's process number when formed (empty: all 0)

    def as_list(self) -> list:
        data = [self.seq, list(self.members), self.comm_id]
        return data + [list(self.fresh), list(self.incarnations)] if self.fresh or self.incarnations else data

    @classmethod
    def from_list(cls, data) -> Group:
        seq, members, comm_id, *rest = data
        fresh, incarnations = rest if rest else ((), ())
        return cls(int(seq), tuple(int(m) for m in members), int(comm_id), tuple(int(m) for m in fresh),
                   tuple(int(i) for i in incarnations))

    def incarnation_of(self, member: int) -> int:
        return self.incarnations[self.members.index(member)] if self.incarnations else 0


class GroupScheduler(Protocol):
    """What serves groups to workers (a Group Generator mode, AD-PSGD's pairing).

    ``request``/``leave`` return the groups the worker must run now, in order;
    ``now_s`` is the caller's clock (the GG service's, or simulated time).
    """

    mode: str

    def request(self, worker: int, now_s: float = 0.0) -> list[Group]: ...

    def leave(self, worker: int, now_s: float = 0.0) -> list[Group]: ...

    def rejoin(self, worker: int, incarnation: int) -> None: ...

    def settle(self, worker: int) -> None: ...

    def left(self) -> frozenset[int]: ...

    def stats(self) -> dict: ...

    @property
    def period(self) -> int: ...


class GroupLedger:
    """Global order, per-worker queues, open groups and communicator-cache models.

    Who is busy (in an open group) and who is still training are kept up to
    date on every assign, pop and leave, so a scheduler asks them in O(1)
    instead of scanning all workers per group (the simulator runs thousands).
    ``on_close(group)``, when set, is called as a group's last member pops it.

    A ledger that is one of several over a job's workers (a shard's,
    :mod:`hetrain.protocols.sharded_gg`) numbers its groups from ``first_seq``,
    keeps each worker's communicator-cache model in the given ``caches`` (one
    per worker, shared with the other ledgers), and with ``absent`` counts
    every worker as gone until it :meth:`arrive` s.
    """

    def __init__(self, num_workers: int, cache_size: int = 60, *, first_seq: int = 0, caches=None,
                 absent: bool = False):
        self.num_workers = num_workers
        self.cache_size = cache_size
        self.next_seq = first_seq
        self.queues: list[deque[Group]] = [deque() for _ in range(num_workers)]
        self.caches = list(caches) if caches is not None else [CommunicatorLRU(cache_size) for _ in range(num_workers)]
        if len(self.caches) != num_workers:
            raise ValueError(f"{len(self.caches)} cache models for {num_workers} workers")
        self.left: set[int] = set(range(num_workers)) if absent else set()
        self._unstarted: dict[int, set[int]] = {}  # seq -> members that have not popped it yet
        self._groups: dict[int, Group] = {}
        self._open_count = [0] * num_workers  # open groups each worker belongs to
        self._busy: set[int] = set()  # workers whose _open_count > 0
        self._active = [] if absent else list(range(num_workers))  # workers that have not left, in rank order
        self.incarnation = [0] * num_workers  # process number of each rank (respawn)
        self.fresh: set[int] = set()  # replacements that have no model yet
        self.on_close = None
        self.groups_formed = 0
        self.members_total = 0

    def assign(self, members) -> Group:
        """Create a group of ``members`` (size >= 2) at the end of the order and queue it for each."""
        members = tuple(sorted(set(members)))
        if len(members) < 2:
            raise ValueError(f"a group needs at least two members, got {members}")
        seq = self.next_seq
        self.next_seq += 1
        fresh = tuple(m for m in members if m in self.fresh)
        incarnations = tuple(self.incarnation[m] for m in members)
        group = Group(seq, members, agree_comm_id(self.caches, members, seq),
                      fresh if len(fresh) < len(members) else (), incarnations if any(incarnations) else ())
        for m in members:
            self.queues[m].append(group)
            self._open_count[m] += 1
            self._busy.add(m)
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
                for m in group.members:
                    self._open_count[m] -= 1
                    if not self._open_count[m]:
                        self._busy.discard(m)
                if self.on_close is not None:
                    self.on_close(group)
            taken.append(group)
        return taken

    def leave(self, worker: int) -> list[Group]:
        """``worker`` stops training: no new group will include it; return what it still owes."""
        self.mark_left(worker)
        return self.pop(worker)

    def mark_left(self, worker: int) -> None:
        """Record that ``worker`` stopped training (no queue to drain: the static schedule)."""
        if worker not in self.left:
            self.left.add(worker)
            self._active.remove(worker)

    def arrive(self, worker: int) -> None:
        """``worker`` (absent until now) may be grouped from now on."""
        if worker in self.left:
            self.left.discard(worker)
            insort(self._active, worker)

    def rejoin(self, worker: int, incarnation: int) -> None:
        """``worker`` (left when it died) is back as process number ``incarnation``, holding no
        communicator and no model: it is grouped again, as *fresh* until it :meth:`settle` s."""
        self.incarnation[worker] = incarnation
        self.caches[worker] = CommunicatorLRU(self.cache_size)
        self.fresh.add(worker)
        self.arrive(worker)

    def settle(self, worker: int) -> None:
        """A replacement has taken a model: its own counts in averages from now on."""
        self.fresh.discard(worker)

    def open_groups(self) -> list[Group]:
        """Groups some member has not started yet, in order."""
        return [self._groups[seq] for seq in sorted(self._unstarted)]

    def busy(self) -> set[int]:
        """Workers that belong to an open group (started or not); a live set, do not modify."""
        return self._busy

    def is_busy(self, worker: int) -> bool:
        return self._open_count[worker] > 0

    def stats(self, mode: str, requests: int) -> dict:
        """The counters every scheduler reports (groups formed, mean size, requests)."""
        formed = self.groups_formed
        return {
            "gg_mode": mode,
            "gg_groups_formed": formed,
            "gg_mean_group_size": self.members_total / formed if formed else 0.0,
            "gg_requests": requests,
        }

    def available(self) -> list[int]:
        """Workers still training, in rank order (a copy)."""
        return list(self._active)

    def available_except(self, worker: int) -> Sequence[int]:
        """Workers still training other than ``worker``, in rank order, as an O(1) read-only view."""
        return _Without(self._active, worker)


class _Without(Sequence):
    """``[w for w in items if w != skip]`` without building it (``items`` sorted, holds ``skip`` at most once).

    ``random.sample`` only indexes its population (or copies a small one), so
    sampling from this view draws exactly what it would from the built list.
    """

    def __init__(self, items: list[int], skip: int):
        self._items = items
        i = bisect_left(items, skip)
        self._cut = i if i < len(items) and items[i] == skip else None

    def __len__(self) -> int:
        return len(self._items) - (self._cut is not None)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        if self._cut is not None and index >= self._cut:
            index += 1
        return self._items[index]
