"""Prague's Group Generator (GG) as pure logic: requests in, group assignments out.

No I/O, no clock, no process group: the caller passes the time of each request
(``now_s``), and everything random comes from one seeded generator, so the same
requests give the same groups. :mod:`hetrain.runtime.gg_service` serves it to a
real job; a discrete-event simulator can call it directly.

Modes (``--gg``), for group size s among n workers:

``random``
    Every request forms a new group: the requester plus s-1 workers drawn at
    random. A worker runs every group queued for it (its own and those formed
    by others' requests) before its next iteration.
``buffer`` (Group Buffer)
    A request first takes the oldest group queued for the requester by others'
    requests; only with an empty buffer does it form a new random group. One
    group per iteration, so a worker rarely waits for the GG or runs extra syncs.
``division`` (Group Division)
    Workers are split into divisions of s that are reshuffled after each round
    of groups; a group is formed inside the requester's division and only from
    workers in no open group, so open groups never overlap.
``static``
    A precomputed schedule of conflict-free steps (see :func:`static_schedule`);
    worker w's k-th group is its group in step k. Each worker computes it
    locally: no GG traffic.
``smart`` (heterogeneity-aware)
    Like ``division``'s rule that a group takes only workers in no open group,
    but the partners are drawn from the workers the GG expects to request
    within the requester's own iteration time (it learns each worker's time
    between requests), so a fast worker is not grouped with a straggler that is
    mid-iteration, while the straggler, when it asks, is grouped with workers
    that will soon be ready. Among the workers due in the window it takes its
    last group's members only to fill places nobody else due can take (so
    pairs that finish together do not re-form forever). A worker that got no
    group on n requests in a row is given a random group (busy members
    allowed), so nobody drifts alone.

Every group gets a place in one global order (:class:`~hetrain.protocols.ledger.Group`
``seq``); workers run their groups in that order, which rules out deadlock.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from hetrain.protocols.comm_lru import CommunicatorLRU, agree_comm_id
from hetrain.protocols.ledger import Group, GroupLedger
from hetrain.protocols.options import OptionError, check_at_least, option

GG_MODES = ("random", "buffer", "division", "static", "smart")
_EMA = 0.3  # weight of the newest compute time in the smart mode's speed estimate
SMART_WINDOW = 0.05  # smart: partners must be due within this fraction of the requester's compute time
SMART_MIN_WINDOW_S = 0.002  # smart: never narrower than this (GG round-trip jitter; very short iterations)
SMART_PATIENCE = 3  # smart: after this many empty requests in a row, wait up to one own compute time


def validate_gg(num_workers: int, group_size: int, mode: str, cache_size: int = 60, workers_per_node=None):
    """Raise a one-line OptionError for a GG setting that cannot work."""
    if mode not in GG_MODES:
        raise OptionError(f"unknown {{gg}} mode {mode!r}; choose one of {', '.join(GG_MODES)}")
    if not 1 <= group_size <= num_workers:
        raise OptionError(
            f"{{group_size}} must be between 1 and the number of workers ({num_workers}), got {group_size}"
        )
    if cache_size < 1:
        raise OptionError(f"{{communicator_cache}} must be >= 1, got {cache_size}")
    if workers_per_node is not None:
        if workers_per_node < 1:
            raise OptionError(f"{{workers_per_node}} must be >= 1, got {workers_per_node}")
        if mode == "static" and num_workers % workers_per_node != 0:
            raise OptionError(
                f"the static schedule needs whole nodes: {num_workers} workers is not a multiple of "
                f"{{workers_per_node}} {workers_per_node}"
            )


@dataclass(frozen=True)
class PragueOptions:
    """Prague's arguments: the Group Generator mode, the group size, the communicator cache."""

    gg: str = option("smart", type=str, choices=GG_MODES,
                     help="prague: Group Generator mode (default smart: heterogeneity-aware)")
    group_size: int = option(2, help="prague: P-Reduce group size s (default 2, see docs/prague.md)")
    communicator_cache: int = option(60, help="prague/adpsgd: communicators kept per worker (default 60)")
    workers_per_node: int | None = option(help="prague: node size for the node-aware static schedule")
    gg_prefetch_ms: float = option(5.0, type=float,
                                   help="prague: ask the Group Generator this many ms before the compute is "
                                        "expected to end, hiding the round trip (default 5; 0: ask after it)")
    gg_shards: int = option(1, help="prague: Group Generators, each over a shard of the workers redrawn every "
                                    "--gg-epoch-s (default 1: one for the job; docs/prague.md)")
    gg_epoch_s: float = option(1.0, type=float, help="prague: seconds between redraws of the shards (default 1)")
    preduce_overlap: int = option(1, choices=(0, 1),
                                  help="prague: 1 runs each step's P-Reduces while the next step computes, "
                                       "applying the average one step late (default 1; 0: block on them; "
                                       "docs/prague.md)")

    def validate(self, num_workers: int) -> PragueOptions:
        validate_gg(num_workers, self.group_size, self.gg, self.communicator_cache, self.workers_per_node)
        check_at_least("gg_prefetch_ms", self.gg_prefetch_ms, 0)
        if self.gg_shards != 1:
            from hetrain.protocols.sharded_gg import check_sharding

            check_sharding(num_workers, self.group_size, self.gg, self.gg_shards, self.gg_epoch_s)
        return self


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
        raise OptionError(
            f"the static schedule needs whole nodes: {n} workers is not a multiple of "
            f"{{workers_per_node}} {per_node}"
        )
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


class GroupGenerator:
    """The GG of one job. ``request(worker, now_s)`` returns the groups to run now, in order.

    ``leave(worker, now_s)`` marks a worker that stopped training: it is never
    put in a new group, and the groups already queued for it are returned so it
    can run them before it exits. An empty list means: no sync this iteration.
    """

    def __init__(self, num_workers, group_size=2, mode="smart", *, seed=0, workers_per_node=None, cache_size=60):
        validate_gg(num_workers, group_size, mode, cache_size, workers_per_node)
        self.num_workers = num_workers
        self.group_size = group_size
        self.mode = mode
        self.rng = random.Random(seed)
        self.ledger = GroupLedger(num_workers, cache_size)
        self.requests = [0] * num_workers
        self.empty_requests = 0
        self._empty_streak = [0] * num_workers
        # smart: each worker's compute-time estimate, when its current compute began (None while it
        # syncs), and a heap of (expected request time, worker) for computing workers (lazy deletion:
        # an entry is live while _due_s[worker] equals its time and the worker is in no open group)
        self._now_s = 0.0
        self._compute_s: list[float | None] = [None] * num_workers
        self._started_s: list[float | None] = [None] * num_workers  # first request: nothing measured
        self._due_s: list[float | None] = [None] * num_workers
        self._due_heap: list[tuple[float, int]] = []
        self._last_group: list[tuple[int, ...]] = [()] * num_workers  # smart: prefer new partners (mixing)
        if mode == "smart":
            self.ledger.on_close = self._group_closed
        self._static = (
            StaticSchedule(num_workers, group_size, workers_per_node, seed, cache_size) if mode == "static" else None
        )
        self._divisions: list[list[int]] = []
        self._division_of: dict[int, int] = {}
        self._groups_since_shuffle = 0
        if mode == "division":
            self._shuffle_divisions()

    # -- requests ------------------------------------------------------------
    def request(self, worker: int, now_s: float = 0.0) -> list[Group]:
        if not 0 <= worker < self.num_workers:
            raise ValueError(f"worker {worker} out of range for {self.num_workers} workers")
        if worker in self.ledger.left:
            raise ValueError(f"worker {worker} asked for a group after leaving")
        step = self.requests[worker]
        self.requests[worker] += 1
        self._now_s = now_s
        if self.mode == "smart":
            self._observe(worker, now_s)
        if self._static is not None:
            group = self._static.group_at(step, worker)
            return [group] if group is not None else self._empty()
        queue = self.ledger.queues[worker]
        if self.mode == "random":
            self._form(worker, self._random_partners(worker))
            return self.ledger.pop(worker)
        if not queue:
            if self.mode == "buffer":
                self._form(worker, self._random_partners(worker))
            elif self.mode == "division":
                self._form(worker, self._division_partners(worker))
            else:
                partners = self._smart_partners(worker, now_s)
                if not partners and self._empty_streak[worker] >= self.num_workers:
                    partners = self._random_partners(worker)
                self._form(worker, partners)
        groups = self.ledger.pop(worker, 1)
        self._empty_streak[worker] = 0 if groups else self._empty_streak[worker] + 1
        if not groups and self.mode == "smart":
            self._computing(worker, now_s)
        return groups or self._empty()

    def leave(self, worker: int, now_s: float = 0.0) -> list[Group]:
        self._now_s = now_s
        if self._static is not None:
            self.ledger.mark_left(worker)
            return []
        self._due_s[worker] = None
        return self.ledger.leave(worker)

    def rejoin(self, worker: int, incarnation: int) -> None:
        """A replacement for ``worker`` joined (see :meth:`GroupLedger.rejoin`)."""
        if self._static is not None:
            raise ValueError("the static schedule takes no replacements")
        self._compute_s[worker] = self._started_s[worker] = self._due_s[worker] = None
        self._last_group[worker] = ()
        self.ledger.rejoin(worker, incarnation)

    def settle(self, worker: int) -> None:
        self.ledger.settle(worker)

    def left(self) -> frozenset[int]:
        """Workers that have left."""
        return frozenset(self.ledger.left)

    @property
    def period(self) -> int:
        """Steps of the static schedule's cycle (0 in the modes that form groups on request)."""
        return self._static.period if self._static is not None else 0

    def stats(self) -> dict:
        return {**self.ledger.stats(self.mode, sum(self.requests)), "gg_empty_requests": self.empty_requests}

    # -- helpers ---------------------------------------------------------------
    def _empty(self) -> list[Group]:
        self.empty_requests += 1
        return []

    def _form(self, worker: int, partners: list[int]) -> None:
        if partners:
            group = self.ledger.assign([worker, *partners])
            for m in group.members:
                self._last_group[m] = group.members
            for m in partners:
                self._due_s[m] = None  # in an open group now: not a candidate
            if self.mode == "division":
                self._groups_since_shuffle += 1
                if self._groups_since_shuffle >= len(self._divisions):
                    self._shuffle_divisions()

    def _others(self, worker: int):
        return self.ledger.available_except(worker)

    def _random_partners(self, worker: int) -> list[int]:
        others = self._others(worker)
        return self.rng.sample(others, min(self.group_size - 1, len(others)))

    def _shuffle_divisions(self) -> None:
        perm = list(range(self.num_workers))
        self.rng.shuffle(perm)
        s = self.group_size
        self._divisions = [perm[i : i + s] for i in range(0, self.num_workers, s)]
        self._division_of = {w: d for d, division in enumerate(self._divisions) for w in division}
        self._groups_since_shuffle = 0

    def _division_partners(self, worker: int) -> list[int]:
        busy = self.ledger.busy()
        if worker in busy:
            return []
        division = self._divisions[self._division_of[worker]]
        return [w for w in division if w != worker and w not in busy and w not in self.ledger.left]

    # -- smart mode: who is due soon ------------------------------------------------
    def _observe(self, worker: int, now_s: float) -> None:
        """``worker`` asks at ``now_s``: learn its compute time; it is no longer computing."""
        started = self._started_s[worker]
        if started is not None:
            dt = max(0.0, now_s - started)
            old = self._compute_s[worker]
            self._compute_s[worker] = dt if old is None else (1 - _EMA) * old + _EMA * dt
        self._started_s[worker] = None
        self._due_s[worker] = None

    def _computing(self, worker: int, now_s: float) -> None:
        """``worker`` starts computing at ``now_s``: it is due at now + its compute estimate."""
        self._started_s[worker] = now_s
        estimate = self._compute_s[worker]
        if estimate is None or worker in self.ledger.left:
            return
        due = now_s + estimate
        self._due_s[worker] = due
        heapq.heappush(self._due_heap, (due, worker))

    def _group_closed(self, group: Group) -> None:
        """The last member took ``group``: the P-Reduce runs now, then its members compute again."""
        for m in group.members:
            if not self.ledger.is_busy(m) and m not in self.ledger.left:
                self._computing(m, self._now_s)

    def _smart_partners(self, worker: int, now_s: float) -> list[int]:
        """Up to s-1 workers in no open group that are due soonest, within the requester's window.

        Members of the requester's last group count only after everyone else
        due in the window (mixing: workers that averaged together finish together).

        The window is ``SMART_WINDOW`` of the requester's own compute time (one
        compute time after ``SMART_PATIENCE`` empty requests in a row), so the
        requester expects to wait at most that long for its partners (workers late
        by more than the window are passed over: they are slower than measured,
        e.g. a random slowdown hit them). A fast worker never
        waits for a straggler in mid-iteration, and a straggler, when it asks, is
        grouped with the fast workers about to ask. The soonest are taken from a
        heap of due times kept up to date, not by scanning all workers.
        """
        if self.ledger.is_busy(worker):
            return []
        own = self._compute_s[worker]
        if own is None:
            return []
        window = own if self._empty_streak[worker] >= SMART_PATIENCE else SMART_WINDOW * own
        window = max(window, SMART_MIN_WINDOW_S)
        horizon = now_s + window
        heap, due_s, ledger = self._due_heap, self._due_s, self.ledger
        chosen: list[int] = []
        passed: list[tuple[float, int]] = []  # entries looked at and not taken: back on the heap after
        repeats: list[tuple[float, int]] = []  # the requester's last partners: only if nobody else is due
        last = self._last_group[worker]
        while heap and len(chosen) < self.group_size - 1:
            due, w = heap[0]
            if due_s[w] != due or ledger.is_busy(w) or w in ledger.left or w == worker:
                heapq.heappop(heap)  # stale entry
                continue
            if due > horizon:
                break
            entry = heapq.heappop(heap)
            if due < now_s - window:  # late by more than the window: slower than measured, skip it
                passed.append(entry)
            elif w in last:
                repeats.append(entry)
            else:
                chosen.append(w)
        while repeats and len(chosen) < self.group_size - 1:
            chosen.append(repeats.pop(0)[1])
        for entry in passed + repeats:
            heapq.heappush(heap, entry)
        return chosen


def scheduler_for(num_workers: int, options: PragueOptions, seed: int = 0) -> GroupGenerator:
    """Prague's Group Generator for ``options`` (every mode; ``static`` computes its schedule locally)."""
    options.validate(num_workers)
    if options.gg_shards > 1:
        from hetrain.protocols.sharded_gg import ShardedGroupGenerator

        return ShardedGroupGenerator(num_workers, options.group_size, options.gg, shards=options.gg_shards,
                                     epoch_s=options.gg_epoch_s, seed=seed, cache_size=options.communicator_cache)
    return GroupGenerator(num_workers, options.group_size, options.gg, seed=seed,
                          workers_per_node=options.workers_per_node, cache_size=options.communicator_cache)
