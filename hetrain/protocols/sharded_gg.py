"""Group Generators in shards, redrawn every epoch: Prague's scheduler for thousands of workers.

One :class:`~hetrain.protocols.group_generator.GroupGenerator` answers every
request of a job, one at a time, and at thousands of workers it is the limit.
:class:`ShardedGroupGenerator` splits the workers into ``shards`` groups, each
with a generator of its own (each can be served by its own endpoint; the
simulator gives each its own queue), and redraws the split every ``epoch_s``
seconds of the job's clock from (seed, epoch), so averaging crosses shards
over epochs. Any party can compute the split for an epoch locally.

Deadlock freedom (groups that share a member run in the same order on every
member). A shard's generator groups a worker only after the worker has
*arrived* in that epoch (its first request there); before that it counts as
absent. Arriving, the worker first leaves its previous generator and gets the
groups still queued for it there. So no generator assigns a worker anything
once it moved on, each worker's groups are assigned in the order it runs them
(its previous epoch's, then this one's), within an epoch the shards share no
member, and every worker runs its groups in increasing (epoch, shard, seq)
order; sequence numbers encode exactly that order:
``seq = (epoch * shards + shard) << 32 | the shard's own counter``.

What moves with a worker between generators: its communicator-cache model (one
per worker for the whole job, member sets in global ranks; since its groups are
assigned in the order it runs them, the agreed ids of P-Reduce's communicators
stay agreed) and the smart mode's estimate of its compute time.
"""

from __future__ import annotations

import random

from hetrain.protocols.comm_lru import CommunicatorLRU
from hetrain.protocols.group_generator import GroupGenerator, validate_gg
from hetrain.protocols.ledger import Group
from hetrain.protocols.options import OptionError

_SEQ_BITS = 32


def check_sharding(num_workers: int, group_size: int, mode: str, shards: int, epoch_s: float) -> None:
    """Raise OptionError for a sharding that cannot work (the static schedule has no generator to shard)."""
    if mode == "static":
        raise OptionError("{gg} static computes its schedule on every worker: it has no generator to shard "
                          "(use {gg_shards} 1)")
    if shards < 1 or shards * max(group_size, 2) > num_workers:
        raise OptionError(f"{{gg_shards}} must be >= 1 and leave each shard at least {max(group_size, 2)} "
                          f"workers, got {shards} for {num_workers} workers")
    if epoch_s <= 0:
        raise OptionError(f"{{gg_epoch_s}} must be > 0, got {epoch_s}")


class _GlobalView:
    """A worker's cache model seen by one shard's ledger: local member tuples in, global ones stored."""

    __slots__ = ("lru", "to_global")

    def __init__(self, lru: CommunicatorLRU, to_global: list[int]):
        self.lru, self.to_global = lru, to_global

    def lookup(self, members):
        return self.lru.lookup(tuple(self.to_global[m] for m in members))

    def use(self, members, comm_id):
        return self.lru.use(tuple(self.to_global[m] for m in members), comm_id)


class _Shard:
    """One (epoch, shard) generator over ``members`` (global ranks, ascending)."""

    def __init__(self, key: tuple[int, int], members: list[int], gen: GroupGenerator):
        self.key, self.members, self.gen = key, members, gen
        self.local = {w: i for i, w in enumerate(members)}
        self.present = 0  # members that arrived and have not left

    def to_global(self, group: Group) -> Group:
        return Group(group.seq, tuple(self.members[m] for m in group.members), group.comm_id)


class ShardedGroupGenerator:
    """``shards`` Group Generators over a split of the workers redrawn every ``epoch_s`` seconds."""

    def __init__(self, num_workers: int, group_size: int = 2, mode: str = "smart", *, shards: int,
                 epoch_s: float, seed: int = 0, cache_size: int = 60):
        validate_gg(num_workers, group_size, mode, cache_size)
        check_sharding(num_workers, group_size, mode, shards, epoch_s)
        self.num_workers, self.group_size, self.mode = num_workers, group_size, mode
        self.shards, self.epoch_s, self.seed = shards, epoch_s, seed
        self.cache_size = cache_size
        self.caches = [CommunicatorLRU(cache_size) for _ in range(num_workers)]
        self._live: dict[tuple[int, int], _Shard] = {}
        self._epoch_of: list[int | None] = [None] * num_workers  # the epoch each worker last asked in
        self._left: set[int] = set()
        self._retired = {"gg_groups_formed": 0, "members": 0, "gg_requests": 0, "gg_empty_requests": 0}
        self._splits: dict[int, tuple[list[list[int]], list[int]]] = {}

    # -- the split ------------------------------------------------------------
    def split(self, epoch: int) -> list[list[int]]:
        """The shards of ``epoch``: ascending global ranks each (a seeded permutation in equal parts)."""
        return self._split(epoch)[0]

    def shard_of(self, worker: int, epoch: int) -> int:
        """Which shard ``worker`` belongs to in ``epoch`` (also the GG endpoint it asks)."""
        return self._split(epoch)[1][worker]

    def _split(self, epoch: int) -> tuple[list[list[int]], list[int]]:
        got = self._splits.get(epoch)
        if got is None:
            perm = list(range(self.num_workers))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(perm)
            k, n = self.shards, self.num_workers
            shards = [sorted(perm[i * n // k:(i + 1) * n // k]) for i in range(k)]
            index_of = [0] * n
            for i, members in enumerate(shards):
                for w in members:
                    index_of[w] = i
            if len(self._splits) > 8:  # recent epochs only; an old one is recomputed if a straggler asks
                self._splits.clear()
            got = self._splits[epoch] = (shards, index_of)
        return got

    def epoch_at(self, now_s: float) -> int:
        return int(now_s // self.epoch_s)

    # -- the scheduler interface ----------------------------------------------------
    def request(self, worker: int, now_s: float = 0.0) -> list[Group]:
        if not 0 <= worker < self.num_workers:
            raise ValueError(f"worker {worker} out of range for {self.num_workers} workers")
        if worker in self._left:
            raise ValueError(f"worker {worker} asked for a group after leaving")
        epoch = max(self.epoch_at(now_s), self._epoch_of[worker] or 0)  # a clock never takes it back
        owed = self._move(worker, epoch, now_s) if self._epoch_of[worker] != epoch else []
        shard = self._here(worker)
        return owed + [shard.to_global(g) for g in shard.gen.request(shard.local[worker], now_s)]

    def leave(self, worker: int, now_s: float = 0.0) -> list[Group]:
        if worker in self._left:  # a worker that left and then died: the launcher's leave for it is a repeat
            return []
        owed = self._depart(worker, now_s) if self._epoch_of[worker] is not None else []
        self._left.add(worker)
        return owed

    def rejoin(self, worker: int, incarnation: int) -> None:
        raise ValueError("sharded Group Generators take no replacement workers (use gg_shards 1 with respawn)")

    def settle(self, worker: int) -> None:
        pass

    def left(self) -> frozenset[int]:
        return frozenset(self._left)

    @property
    def period(self) -> int:
        return 0

    def endpoint(self, worker: int, now_s: float) -> int:
        """The shard (service endpoint) ``worker``'s request at ``now_s`` goes to."""
        return self.shard_of(worker, max(self.epoch_at(now_s), self._epoch_of[worker] or 0))

    def stats(self) -> dict:
        totals = dict(self._retired)
        for shard in self._live.values():
            self._add_stats(totals, shard)
        formed = totals.pop("gg_groups_formed")
        members = totals.pop("members")
        return {"gg_mode": self.mode, "gg_shards": self.shards, "gg_groups_formed": formed,
                "gg_mean_group_size": members / formed if formed else 0.0, **totals}

    # -- moving between generators ------------------------------------------------
    def _here(self, worker: int) -> _Shard:
        epoch = self._epoch_of[worker]
        return self._live[(epoch, self.shard_of(worker, epoch))]

    def _move(self, worker: int, epoch: int, now_s: float) -> list[Group]:
        """Leave the previous generator (its groups owed first), arrive in this epoch's shard."""
        owed, estimate = [], None
        if self._epoch_of[worker] is not None:
            old = self._here(worker)
            estimate = old.gen.compute_estimate(old.local[worker])
            owed = self._depart(worker, now_s)
        self._epoch_of[worker] = epoch
        self._sweep(epoch)
        new = self._shard(epoch, self.shard_of(worker, epoch))
        local = new.local[worker]
        new.gen.arrive(local)
        new.present += 1
        if estimate is not None:
            new.gen.adopt_compute_estimate(local, estimate)
        return owed

    def _depart(self, worker: int, now_s: float) -> list[Group]:
        shard = self._here(worker)
        owed = [shard.to_global(g) for g in shard.gen.leave(shard.local[worker], now_s)]
        shard.present -= 1
        return owed

    def _shard(self, epoch: int, index: int) -> _Shard:
        key = (epoch, index)
        shard = self._live.get(key)
        if shard is None:
            members = self.split(epoch)[index]
            gen = GroupGenerator(len(members), min(self.group_size, len(members)), self.mode,
                                 seed=(self.seed * 1_000_003 + epoch * self.shards + index) & 0xFFFFFFFF,
                                 cache_size=self.cache_size, first_seq=(epoch * self.shards + index) << _SEQ_BITS,
                                 caches=[_GlobalView(self.caches[w], members) for w in members],
                                 absent=True)  # grouped only once arrived
            shard = self._live[key] = _Shard(key, members, gen)
        return shard

    def _sweep(self, epoch: int) -> None:
        """Drop generators of earlier epochs that nobody is in (nobody can arrive in a past epoch)."""
        for key in [k for k, sh in self._live.items() if k[0] < epoch and sh.present == 0]:
            self._add_stats(self._retired, self._live.pop(key))

    @staticmethod
    def _add_stats(totals: dict, shard: _Shard) -> None:
        for name, value in shard.gen.totals().items():
            totals[name] += value
