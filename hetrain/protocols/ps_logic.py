"""The parameter server's rules as pure logic: pushes in, model updates and answers out.

One :class:`ParameterServerLogic` per job (it lives beside rank 0). Workers
push an update (the runtime pushes model deltas, the simulator gradients: the
payloads are opaque here) and wait for the server's answer (the new global
model). The logic decides what to add to the global model and whom to answer:

- synchronous (``staleness == 0``, bulk-synchronous): the server waits for one
  push from every worker still training, then adds their mean and answers them
  all;
- asynchronous (``staleness = s > 0``, stale-synchronous): the server adds
  each push, scaled by 1/n so a step matches the synchronous mean, as it
  arrives, and answers at once unless the pusher would be more than s pushes
  ahead of the slowest worker still training; then its answer waits until the
  slowest catches up or leaves.

A worker that stops ``leave``\\ s: it is no longer waited for (a synchronous
round closes without it, a held worker is released if it was the slowest). A worker
that ``join``\\ s (a new member, or a dead one's replacement) is waited for from the
next push on, counted as far as the slowest worker still training.
Both the runtime (:mod:`hetrain.runtime.parameter_server`) and the simulator
(:mod:`hetrain.sim.ps_sim`) drive this class.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from hetrain.protocols.options import OptionError, ProtocolOptions, option


@dataclass(frozen=True)
class PSOptions(ProtocolOptions):
    """The parameter server's arguments."""

    staleness: int = option(0, help="hop: bounded staleness s (default 1); ps: asynchronous with staleness s "
                                    "(default 0: synchronous)")

    def validate(self, num_workers: int) -> PSOptions:
        if self.staleness < 0:
            raise OptionError(f"{{staleness}} must be >= 0 (0: synchronous), got {self.staleness}")
        return self

    def supports_respawn(self) -> bool:
        return True  # a joining worker's first push is empty: the server answers it with the global model


@dataclass
class ServerStep:
    """What the driver does after a push or a leave.

    Add ``weight * sum(apply)`` to the global model (nothing when ``apply`` is
    empty), then answer ``answer`` (worker ranks) with the new global model.
    """

    apply: list = field(default_factory=list)
    weight: float = 0.0
    answer: list[int] = field(default_factory=list)


class ParameterServerLogic:
    """The server's rules. Every push and leave costs O(log n) (the simulator drives thousands of workers):
    the round's completeness, the slowest active worker's push count and the held answers are kept
    up to date instead of recomputed from all workers."""

    def __init__(self, num_workers: int, staleness: int = 0):
        PSOptions(staleness).validate(num_workers)
        self.num_workers = num_workers
        self.staleness = staleness
        self.pushes = [0] * num_workers
        self.left: set[int] = set()
        self._round: dict[int, object] = {}  # synchronous: this round's pushes by worker
        self._round_active = 0  # of them, workers still training
        # asynchronous: answers that wait for the slowest, a heap of (pushes when held, order held, worker)
        self._held: list[tuple[int, int, int]] = []
        self._held_order = 0
        self._held_left: list[tuple[int, int]] = []  # (order held, worker) of held workers that left
        self._at_count: dict[int, int] = {0: num_workers}  # active workers by their push count
        self._slowest = 0

    def restore_pushes(self, pushes: list[int]) -> None:
        """Start from each worker's push count of a checkpoint (before any push or leave of this run)."""
        if len(pushes) != self.num_workers:
            raise ValueError(f"a checkpoint of {len(pushes)} workers' pushes, for a server of {self.num_workers}")
        self.pushes = [int(p) for p in pushes]
        self._at_count = {}
        for count in self.pushes:
            self._at_count[count] = self._at_count.get(count, 0) + 1
        self._slowest = min(self.pushes)

    @property
    def synchronous(self) -> bool:
        return self.staleness == 0

    def active(self) -> set[int]:
        """Workers still training."""
        return set(range(self.num_workers)) - self.left

    def push(self, worker: int, payload) -> ServerStep:
        if worker in self.left:
            raise ValueError(f"worker {worker} pushed after leaving")
        count = self.pushes[worker] = self.pushes[worker] + 1
        self._at_count[count - 1] -= 1
        self._at_count[count] = self._at_count.get(count, 0) + 1
        if self.synchronous:
            if worker not in self._round:
                self._round_active += 1
            self._round[worker] = payload
            return self._close_round()
        heapq.heappush(self._held, (count, self._held_order, worker))
        self._held_order += 1
        step = self._release()
        step.apply, step.weight = [payload], 1.0 / self.num_workers
        return step

    def leave(self, worker: int) -> ServerStep:
        if worker not in self.left:
            self.left.add(worker)
            self._at_count[self.pushes[worker]] -= 1
            if worker in self._round:
                self._round_active -= 1
            if any(entry[2] == worker for entry in self._held):  # held workers seldom leave: O(held) is fine
                self._held_left += [(order, w) for _, order, w in self._held if w == worker]
                self._held = [entry for entry in self._held if entry[2] != worker]
                heapq.heapify(self._held)
        return self._close_round() if self.synchronous else self._release()

    def join(self, worker: int) -> ServerStep:
        """``worker`` (a new process of a rank that left or died) trains from now on: waited for from its next
        push, counted as far as the slowest worker still training (so it holds no one back). A worker still
        active (its death and return seen at once) leaves first; carry out the step that returns."""
        step = ServerStep() if worker in self.left else self.leave(worker)
        start = self._slowest_pushes() if len(self.left) < self.num_workers else max(self.pushes)
        self.left.discard(worker)
        self.pushes[worker] = start
        self._at_count[start] = self._at_count.get(start, 0) + 1
        self._slowest = min(self._slowest, start)
        return step

    def waiting_for(self) -> list[int]:
        """Synchronous: the workers the open round still needs (for timeout errors)."""
        return sorted(self.active() - set(self._round))

    def _close_round(self) -> ServerStep:
        if not self._round or self._round_active < self.num_workers - len(self.left):
            return ServerStep()
        workers = sorted(self._round)
        payloads = [self._round[w] for w in workers]
        self._round.clear()
        self._round_active = 0
        return ServerStep(payloads, 1.0 / len(payloads), workers)

    def _slowest_pushes(self) -> int:
        """The fewest pushes of a worker still training (0 when none is): it only ever grows."""
        if len(self.left) == self.num_workers:
            return 0
        while not self._at_count.get(self._slowest):
            self._slowest += 1
        return self._slowest

    def _release(self) -> ServerStep:
        """Answer the held workers that are now at most ``staleness`` pushes ahead of the slowest (or left),
        in the order they were held."""
        limit = self._slowest_pushes() + self.staleness
        released, self._held_left = self._held_left, []
        while self._held and self._held[0][0] <= limit:
            _, order, worker = heapq.heappop(self._held)
            released.append((order, worker))
        return ServerStep(answer=[worker for _, worker in sorted(released)])
