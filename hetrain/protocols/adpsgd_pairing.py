"""AD-PSGD's pairing (Lian et al., ICML'18) as pure logic: requests in, pairs out.

Workers are split into a bipartite graph: even ranks are *active*, odd ranks
*passive*. After each local step an active worker picks a random passive
worker that is still training and averages with it, atomically (the pair is a
P-Reduce of two). A passive worker never initiates: at each of its syncs it
serves, one after another, every pair that actives queued for it. Actives wait
only on passives and passives wait on nobody, so the wait-for graph has no
cycle; the pairs also get a place in one global order, like Prague's groups.
"""

from __future__ import annotations

import dataclasses
import random
from bisect import bisect_left, insort
from dataclasses import dataclass

from hetrain.protocols.comm_budget import cache_entries, check_comm_memory, comm_memory_option
from hetrain.protocols.ledger import Group, GroupLedger
from hetrain.protocols.options import OptionError, ProtocolOptions, option


@dataclass(frozen=True)
class ADPSGDOptions(ProtocolOptions):
    """AD-PSGD's arguments."""

    communicator_cache: int = option(60, help="prague/adpsgd: communicators kept per worker (default 60)")
    comm_memory_mb: int = comm_memory_option()

    def validate(self, num_workers: int) -> ADPSGDOptions:
        if self.communicator_cache < 1:
            raise OptionError(f"{{communicator_cache}} must be >= 1, got {self.communicator_cache}")
        check_comm_memory(self.comm_memory_mb)
        return self

    caches_member_sets = True

    def fit_memory(self, flat_nbytes: int, *, compressed: bool, nccl: bool, num_workers: int | None = None) -> ADPSGDOptions:
        entries = cache_entries(self.communicator_cache, self.comm_memory_mb, flat_nbytes, 2,  # pairs
                                compressed=compressed, nccl=nccl)
        return self if entries == self.communicator_cache else dataclasses.replace(self, communicator_cache=entries)


class ActivePassivePairing:
    """Same interface as :class:`hetrain.protocols.group_generator.GroupGenerator`."""

    mode = "adpsgd"

    def __init__(self, num_workers: int, *, seed: int = 0, cache_size: int = 60):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.num_workers = num_workers
        self.rng = random.Random(seed)
        self.ledger = GroupLedger(num_workers, cache_size)
        self.requests = [0] * num_workers
        # passives still training, in rank order: what ``[w for w in ledger.available() if passive]``
        # would build, kept up to date on leave/rejoin instead (O(1) per request at thousands of workers)
        self._passive = [w for w in range(num_workers) if not self.is_active(w)]

    @staticmethod
    def is_active(worker: int) -> bool:
        return worker % 2 == 0

    def request(self, worker: int, now_s: float = 0.0) -> list[Group]:
        if worker in self.ledger.left:
            raise ValueError(f"worker {worker} asked for a partner after leaving")
        self.requests[worker] += 1
        if self.is_active(worker):
            if self._passive:
                self.ledger.assign([worker, self.rng.choice(self._passive)])
            return self.ledger.pop(worker)
        return self.ledger.pop(worker)

    def leave(self, worker: int, now_s: float = 0.0) -> list[Group]:
        if not self.is_active(worker) and worker not in self.ledger.left:
            i = bisect_left(self._passive, worker)
            if i < len(self._passive) and self._passive[i] == worker:
                del self._passive[i]
        return self.ledger.leave(worker)

    def rejoin(self, worker: int, incarnation: int) -> None:
        if not self.is_active(worker) and worker in self.ledger.left:
            insort(self._passive, worker)
        self.ledger.rejoin(worker, incarnation)

    def settle(self, worker: int) -> None:
        self.ledger.settle(worker)

    def left(self) -> frozenset[int]:
        return frozenset(self.ledger.left)

    period = 0  # pairs are formed on request; there is no static cycle

    def stats(self) -> dict:
        return self.ledger.stats(self.mode, sum(self.requests))


def scheduler_for(num_workers: int, options: ADPSGDOptions, seed: int = 0) -> ActivePassivePairing:
    options.validate(num_workers)
    return ActivePassivePairing(num_workers, seed=seed, cache_size=options.communicator_cache)
