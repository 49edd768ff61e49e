"""Hop's per-worker state machine: update queues, token queues, backup workers,
bounded staleness and iteration skipping (Luo et al., "Hop: Heterogeneity-aware
decentralized training", ASPLOS'19). D-PSGD is the special case b = s = 0 with
no tokens.

One :class:`HopWorker` per worker. The driver (runtime or simulator) feeds it
arrivals and asks it what to do; payloads (models) are opaque objects::

    worker.can_start()                    -> tokens held from every out-neighbour?
    worker.plan_skip()                    -> SkipPlan or None (call before start)
    worker.start()                        -> consume one token per out-neighbour
    ... compute, then send (worker.iteration, model) to worker.out_neighbors ...
    worker.ready_to_average()             -> enough usable updates?
    worker.complete()                     -> AveragePlan: terms to average, tokens to return
    worker.receive_update(src, k, model) / worker.receive_tokens(src, n)

Iteration k of worker i uses, from each in-neighbour j, the freshest update k'
with k - s <= k' <= k; it waits for such updates from all but b in-neighbours.
If j has skipped past that window, its oldest newer update stands in (never
consumed early). An update that arrives too late for its window is still used,
at j's full weight, by the next average that has nothing of j in its window:
only the newest such update of j is kept (older ones are dropped and counted).
Late updates are never waited for, so backup workers keep their speed; but a
neighbour that is always late (the straggler under backup workers) still has
its work mixed in. Dropping them instead left the straggler's data out of the
model, whose test loss then rose the longer it trained (docs/decisions/hop-uses-late-updates.md). Tokens bound how late an update can be: max_ig.

An update older than the iteration it is averaged into (stale, or late) is a neighbour's model of
iteration k' < k: averaged as it is, it pulls this worker back by the steps taken since k' (at equal
speeds on a ring with backup 1 the average advanced about 3/4 of a step per iteration). So such a
term can carry ``reference = k'`` (``late_updates="progress"``; the default, "model", is Hop's
rule) and the driver then adds back ``weight * (P_k - P_k')``, the worker's own steps since k'
(:mod:`hetrain.protocols.lag_compensation`; docs/decisions/hop-late-updates-progress.md). A term of this iteration, or a newer stand-in, needs nothing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hetrain.protocols.hop_config import HopConfig


@dataclass
class AverageTerm:
    src: int
    iteration: int
    weight: float
    payload: object
    reference: int | None = None  # add weight * (own progress now - at this iteration); None: nothing


@dataclass
class AveragePlan:
    """New model = self_weight * own + sum(term.weight * term.payload); weights sum to 1."""

    iteration: int
    self_weight: float
    terms: list[AverageTerm]
    tokens_to: list[int] = field(default_factory=list)  # in-neighbours owed one token each
    token_count: int = 1


@dataclass
class SkipPlan:
    """Jump from ``from_iteration`` to ``to_iteration``, averaging with ``average``.

    The driver applies the average, sends the averaged model to the out-neighbours
    tagged ``to_iteration - 1`` (so none of them waits for the skipped iterations'
    models) and returns ``average.token_count`` tokens to each of ``average.tokens_to``.
    """

    from_iteration: int
    to_iteration: int
    average: AveragePlan


class HopWorker:
    def __init__(self, rank: int, in_weights: dict[int, float], self_weight: float,
                 out_neighbors: list[int], config: HopConfig):
        self.rank = rank
        self.in_weights = dict(in_weights)
        self.self_weight = self_weight
        self.out_neighbors = list(out_neighbors)
        self.config = config
        self.iteration = 0  # the iteration being run (or next to start)
        self.started = False
        self.queues: dict[int, deque] = {j: deque() for j in self.in_weights}  # (iteration, payload)
        self.tokens = {m: (config.max_ig or 0) for m in self.out_neighbors}
        self.finished_senders: set[int] = set()  # in-neighbours that will send no more updates
        self.finished_token_sources: set[int] = set()  # out-neighbours that will return no more tokens
        self.updates_received = 0
        self.updates_used = 0
        self.updates_stale = 0
        self.updates_dropped = 0
        self.updates_late = 0  # used after missing their window (see the module docstring)
        self.max_iteration_gap = 0
        self.skipped_iterations = 0
        self.queued_updates = 0  # updates held in all queues now (each is a model: this is memory)
        self.queued_updates_max = 0
        self.backup = config.backup  # lowered when deaths leave fewer in-neighbours than backup + 1
        self.neighbours_lost = 0

    def reconfigure(self, in_weights: dict[int, float], self_weight: float, out_neighbors: list[int]) -> list[int]:
        """Adopt new neighbours after deaths (see :mod:`hetrain.protocols.membership`); return the new
        out-neighbours, to which the driver must send the last model it sent (with that model's
        iteration): they may be waiting for it, having become this worker's out-neighbours after it
        was sent, while this worker waits for theirs (found by the property test).

        Queues of continuing in-neighbours are kept, those of removed ones dropped
        (counted as dropped updates); a new in-neighbour starts with an empty queue.
        A new out-neighbour starts with ``max_ig`` tokens, like every edge at the
        start; a removed one's tokens are forgotten, so nobody waits on the dead.
        Backup workers are lowered to in-degree - 1 when fewer remain.
        """
        new_out = [m for m in out_neighbors if m not in self.out_neighbors]
        for gone in set(self.in_weights) - set(in_weights):
            queue = self.queues.pop(gone)
            self.updates_dropped += len(queue)
            self.queued_updates -= len(queue)
            self.finished_senders.discard(gone)
            self.neighbours_lost += 1
        for new in set(in_weights) - set(self.in_weights):
            self.queues[new] = deque()
        for gone in set(self.out_neighbors) - set(out_neighbors):
            self.tokens.pop(gone, None)
            self.finished_token_sources.discard(gone)
        for new in set(out_neighbors) - set(self.out_neighbors):
            self.tokens[new] = self.config.max_ig or 0
        self.in_weights = dict(in_weights)
        self.self_weight = self_weight
        self.out_neighbors = list(out_neighbors)
        self.backup = min(self.config.backup, max(0, len(in_weights) - 1))
        return new_out

    def replace_neighbour(self, peer: int) -> None:
        """``peer`` died and its replacement joined before this worker adopted the death (the graph is then
        the same, and :meth:`reconfigure` keeps the edge): forget what the dead process sent, as a death
        and a join adopted apart would. Its queued updates are dropped (counted) and the edge's tokens
        start afresh at ``max_ig``: the replacement's updates start at the iteration it adopts, maybe
        below the dead process's, and a queue must stay in iteration order."""
        if peer in self.queues:
            queue = self.queues[peer]
            self.updates_dropped += len(queue)
            self.queued_updates -= len(queue)
            queue.clear()
            self.finished_senders.discard(peer)
        if peer in self.tokens:
            self.tokens[peer] = self.config.max_ig or 0
            self.finished_token_sources.discard(peer)

    @classmethod
    def for_rank(cls, topology, rank: int, config: HopConfig) -> HopWorker:
        """Worker ``rank`` of ``topology``, its weights from the graph's mixing matrix."""
        weights, own = topology.mixing_weights[rank]
        return cls(rank, dict(weights), own, topology.out_neighbors[rank], config)

    @property
    def progress_iterations_kept(self) -> int:
        """How many iterations of its own progress a driver keeps for :attr:`AverageTerm.reference`: an update
        used is at most ``staleness`` old in its window, or late by at most ``max_ig`` (tokens)."""
        return self.config.staleness + (self.config.max_ig or 0) + 1 if self._keeps_progress else 1

    @property
    def _keeps_progress(self) -> bool:
        return self.config.late_updates == "progress"

    # ----- arrivals ---------------------------------------------------------
    def receive_update(self, src: int, iteration: int, payload) -> None:
        if src not in self.queues:  # sent before a reconfiguration removed the edge (a replacement joined)
            self.updates_dropped += 1
            return
        self.queues[src].append((iteration, payload))
        self.queued_updates += 1
        self.queued_updates_max = max(self.queued_updates_max, self.queued_updates)
        self.updates_received += 1
        self.max_iteration_gap = max(self.max_iteration_gap, abs(iteration - self.iteration))

    def receive_tokens(self, src: int, count: int = 1) -> None:
        if src in self.tokens:  # else returned over an edge a reconfiguration has removed since
            self.tokens[src] += count

    def sender_finished(self, src: int) -> None:
        """In-neighbour ``src`` has sent its last update (its STOP came after them on that channel)."""
        self.finished_senders.add(src)

    def token_source_finished(self, src: int) -> None:
        """Out-neighbour ``src`` will return no more tokens."""
        self.finished_token_sources.add(src)

    # ----- starting an iteration -------------------------------------------
    def can_start(self) -> bool:
        return not self.config.uses_tokens or all(t > 0 for t in self.tokens.values())

    def start(self) -> None:
        assert not self.started and self.can_start(), "start() needs a token from every out-neighbour"
        if self.config.uses_tokens:
            for m in self.tokens:
                self.tokens[m] -= 1
        self.started = True

    def plan_skip(self) -> SkipPlan | None:
        """If every in-neighbour is >= skip_threshold ahead, plan a jump to their iteration.

        Every in-neighbour, not all but b: a worker that is ahead of one neighbour
        and behind another is not the straggler and must not skip.
        """
        threshold = self.config.skip_threshold
        if threshold is None or self.started or not self.in_weights:
            return None
        ahead = self.iteration + threshold
        for q in self.queues.values():  # the common answer, no: some neighbour is not far enough ahead
            if not q or q[-1][0] < ahead:
                return None
        newest = {j: q[-1][0] for j, q in self.queues.items()}
        target = min(newest.values())
        if self.config.uses_tokens:  # a skipped iteration needs a token like a run one
            target = min(target, self.iteration + min(self.tokens.values(), default=0))
        if target <= self.iteration:
            return None
        terms = [AverageTerm(j, k, self.in_weights[j], self.queues[j][-1][1]) for j, k in newest.items()]
        return SkipPlan(self.iteration, target, self._normalised(target, terms))

    def apply_skip(self, plan: SkipPlan) -> AveragePlan:
        """Advance the counter; the returned plan owes tokens for every skipped iteration."""
        skipped = plan.to_iteration - plan.from_iteration
        if self.config.uses_tokens:
            for m in self.tokens:
                self.tokens[m] -= skipped
        self.skipped_iterations += skipped
        self.iteration = plan.to_iteration
        self._drop_out_of_window(self.iteration)
        plan.average.tokens_to = list(self.in_weights) if self.config.uses_tokens else []
        plan.average.token_count = skipped
        return plan.average

    # ----- finishing an iteration --------------------------------------------
    def _usable(self, src: int) -> int | None:
        """Index in src's queue of the update to use at this iteration, or None."""
        k, s = self.iteration, self.config.staleness
        best = None
        for index, (kk, _) in enumerate(self.queues[src]):
            if k - s <= kk <= k:
                best = index  # queues are in arrival order, i.e. increasing iteration
            elif kk > k:
                return best if best is not None else index
        return best

    def usable_count(self) -> int:
        """How many in-neighbours have a usable update: ``_usable`` is None only when every queued
        update is older than the window, so one update of iteration >= k - s is enough (the newest,
        last in the queue, is checked first)."""
        oldest, queues = self.iteration - self.config.staleness, self.queues
        count = 0
        for j in self.in_weights:
            queue = queues[j]
            if queue and (queue[-1][0] >= oldest or any(kk >= oldest for kk, _ in queue)):
                count += 1
        return count

    def needed_count(self) -> int:
        return len(self.in_weights) - self.backup

    def ready_to_average(self) -> bool:
        return self.usable_count() >= self.needed_count()

    def blocked_by_stopped_neighbors(self) -> bool:
        """True when a wait can never end because the neighbours it needs have stopped."""
        if self.started:
            alive_missing = sum(
                self._usable(j) is None and j not in self.finished_senders for j in self.in_weights
            )
            return self.usable_count() + alive_missing < self.needed_count()
        if self.config.uses_tokens:
            return any(t <= 0 and m in self.finished_token_sources for m, t in self.tokens.items())
        return False

    def complete(self) -> AveragePlan:
        """Take the updates for this iteration; advance to the next one."""
        assert self.started and self.ready_to_average(), "complete() needs enough usable updates"
        k = self.iteration
        terms = []
        for j in self.in_weights:
            index = self._usable(j)
            late = index is None
            if late:
                if not self.queues[j]:
                    continue
                index = len(self.queues[j]) - 1  # the one update kept of those too late for their window
            kk, payload = self.queues[j][index]
            terms.append(AverageTerm(j, kk, self.in_weights[j], payload, kk if kk < k and self._keeps_progress
                                     else None))
            if kk <= k:  # consume it and everything older; a newer stand-in stays for later
                self.updates_dropped += index
                for _ in range(index + 1):
                    self.queues[j].popleft()
                self.queued_updates -= index + 1
                self.updates_used += 1
                self.updates_stale += kk < k
                self.updates_late += late
        self.iteration = k + 1
        self.started = False
        self._drop_out_of_window(self.iteration)
        plan = self._normalised(k, terms)
        plan.tokens_to = list(self.in_weights) if self.config.uses_tokens else []
        return plan

    # ----- helpers ------------------------------------------------------------
    def _drop_out_of_window(self, iteration: int) -> None:
        """Drop updates too old for ``iteration``'s window, except each queue's newest (a late update)."""
        oldest = iteration - self.config.staleness
        for queue in self.queues.values():
            while len(queue) > 1 and queue[0][0] < oldest:
                queue.popleft()
                self.queued_updates -= 1
                self.updates_dropped += 1

    def _normalised(self, iteration: int, terms: list[AverageTerm]) -> AveragePlan:
        total = self.self_weight + sum(t.weight for t in terms)
        for t in terms:
            t.weight /= total
        return AveragePlan(iteration, self.self_weight / total, terms)

    def waiting_for(self) -> str:
        """What this worker is waiting for, for timeout errors."""
        if not self.started:
            short = sorted(m for m, t in self.tokens.items() if t <= 0)
            return f"a token from worker(s) {short} to start iteration {self.iteration}"
        missing = sorted(j for j in self.in_weights if self._usable(j) is None)
        lo = self.iteration - self.config.staleness
        return (
            f"updates of iterations {lo}..{self.iteration} from {self.needed_count() - self.usable_count()} "
            f"more of worker(s) {missing}"
        )

    def counters(self) -> dict:
        return {
            "updates_received": self.updates_received,
            "updates_used": self.updates_used,
            "updates_stale": self.updates_stale,
            "updates_dropped": self.updates_dropped,
            "updates_late": self.updates_late,
            "max_iteration_gap": self.max_iteration_gap,
            "skipped_iterations": self.skipped_iterations,
            "queued_updates_max": self.queued_updates_max,
        }


def make_hop_workers(topology, config: HopConfig) -> list[HopWorker]:
    """One HopWorker per worker of ``topology``, weighted by its mixing matrix."""
    return [HopWorker.for_rank(topology, i, config) for i in range(topology.num_workers)]
