"""``--gg static``: a precomputed schedule of conflict-free steps, computed by every worker locally.

Worker w's k-th group is its group in step k of :func:`static_schedule`; there
is no Group Generator traffic, and so no Group Generator to route around a death
(the static schedule's runs abort on one) or to admit a replacement.
"""

from __future__ import annotations

import random

from hetrain.protocols.comm_lru import CommunicatorLRU, agree_comm_id
from hetrain.protocols.gg_modes.base import GroupingMode
from hetrain.protocols.ledger import Group, GroupLedger
from hetrain.protocols.options import OptionError


def whole_nodes_error(num_workers: int, workers_per_node: int) -> OptionError:
    return OptionError(f"the static schedule needs whole nodes: {num_workers} workers is not a multiple of "
                       f"{{workers_per_node}} {workers_per_node}")


def static_schedule(num_workers: int, group_size: int, workers_per_node=None, seed: int = 0):
    """A conflict-free schedule: a list of steps, each a list of disjoint groups (size >= 2).

    Without nodes (``workers_per_node`` None, or one node): n steps, step k cuts
    a seeded random permutation into groups of ``group_size``. Node-aware (like
    the Prague prototype for 4 workers per node): for each local rank m in turn,
    an inter-node step (one group of local rank m of every node, plus pairs of
    the other local ranks inside each node, one left alone when their count is
    odd) followed by an intra-node step (each node is one group); period 2 x
    workers_per_node. Workers alone in a step skip it.
    """
    n = num_workers
    steps: list[list[tuple[int, ...]]] = []
    per_node = workers_per_node
    if per_node is None or per_node >= n:
        rng = random.Random(seed)
        for _ in range(max(1, n)):
            perm = list(range(n))
            rng.shuffle(perm)
            chunks = (tuple(sorted(perm[i : i + group_size])) for i in range(0, n, group_size))
            steps.append(sorted(c for c in chunks if len(c) > 1))
        return steps
    if n % per_node:
        raise whole_nodes_error(n, per_node)
    nodes = n // per_node
    intra = [tuple(range(node * per_node, (node + 1) * per_node)) for node in range(nodes)]
    for m in range(per_node):
        groups = [tuple(node * per_node + m for node in range(nodes))]
        rest = [(m + 1 + i) % per_node for i in range(per_node - 1)]
        if len(rest) % 2:
            rest = rest[1:]
        for node in range(nodes):
            base = node * per_node
            groups.extend(tuple(sorted((base + a, base + b))) for a, b in zip(rest[0::2], rest[1::2]))
        steps.append(sorted(g for g in groups if len(g) > 1))
        steps.append([g for g in intra if len(g) > 1])
    return steps


class StaticSchedule:
    """Worker w's k-th group under :func:`static_schedule`, with agreed sequence and communicator ids.

    Every worker builds the same object and so derives the same ``seq`` and
    ``comm_id`` for each step (it replays all workers' communicator caches).
    """

    def __init__(self, num_workers, group_size, workers_per_node=None, seed=0, cache_size=60):
        self.num_workers = num_workers
        self.steps = static_schedule(num_workers, group_size, workers_per_node, seed)
        self.caches = [CommunicatorLRU(cache_size) for _ in range(num_workers)]
        self._done: dict[int, dict[int, Group]] = {}
        self._next_step = 0
        self._next_seq = 0

    @property
    def period(self) -> int:
        return len(self.steps)

    def group_at(self, step: int, worker: int) -> Group | None:
        while self._next_step <= step:
            self._materialize(self._next_step)
            self._next_step += 1
        return self._done[step].get(worker)

    def _materialize(self, step: int) -> None:
        assigned: dict[int, Group] = {}
        for members in self.steps[step % len(self.steps)]:
            seq = self._next_seq
            self._next_seq += 1
            group = Group(seq, members, agree_comm_id(self.caches, members, seq))
            for m in members:
                assigned[m] = group
        self._done[step] = assigned
        self._done.pop(step - 4 * len(self.steps) - 64, None)


class StaticMode(GroupingMode):
    """Answers request k of worker w with its group in step k of the schedule (the ledger only records leaves)."""

    name = "static"

    def __init__(self, ledger: GroupLedger, rng: random.Random, group_size: int, *, seed: int = 0,
                 workers_per_node: int | None = None):
        super().__init__(ledger, rng, group_size)
        self.schedule = StaticSchedule(ledger.num_workers, group_size, workers_per_node, seed, ledger.cache_size)

    @classmethod
    def check_settings(cls, num_workers: int, group_size: int, workers_per_node: int | None) -> None:
        if workers_per_node is not None and num_workers % workers_per_node != 0:
            raise whole_nodes_error(num_workers, workers_per_node)

    @classmethod
    def create(cls, ledger, rng, group_size, *, seed=0, workers_per_node=None) -> StaticMode:
        return cls(ledger, rng, group_size, seed=seed, workers_per_node=workers_per_node)

    def request(self, worker: int, step: int, now_s: float) -> list[Group]:
        group = self.schedule.group_at(step, worker)
        return [group] if group is not None else self._empty()

    def leave(self, worker: int, now_s: float) -> list[Group]:
        self.ledger.mark_left(worker)  # every group is the schedule's: nothing queued to owe
        return []

    def rejoin(self, worker: int, incarnation: int) -> None:
        raise ValueError("the static schedule takes no replacements")

    @property
    def period(self) -> int:
        return self.schedule.period
