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
round closes without it, a held worker is released if it was the slowest).
Both the runtime (:mod:`hetrain.runtime.parameter_server`) and the simulator
(:mod:`hetrain.sim.ps_sim`) drive this class.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetrain.protocols.options import OptionError, option


@dataclass(frozen=True)
class PSOptions:
    """The parameter server's arguments."""

    staleness: int = option(0, help="hop: bounded staleness s (default 1); ps: asynchronous with staleness s "
                                    "(default 0: synchronous)")

    def validate(self, num_workers: int) -> PSOptions:
        if self.staleness < 0:
            raise OptionError(f"{{staleness}} must be >= 0 (0: synchronous), got {self.staleness}")
        return self


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
    def __init__(self, num_workers: int, staleness: int = 0):
        PSOptions(staleness).validate(num_workers)
        self.num_workers = num_workers
        self.staleness = staleness
        self.pushes = [0] * num_workers
        self.left: set[int] = set()
        self._round: dict[int, object] = {}  # synchronous: this round's pushes by worker
        self._held: list[int] = []  # asynchronous: workers whose answer waits for the slowest

    @property
    def synchronous(self) -> bool:
        return self.staleness == 0

    def active(self) -> set[int]:
        """Workers still training."""
        return set(range(self.num_workers)) - self.left

    def push(self, worker: int, payload) -> ServerStep:
        if worker in self.left:
            raise ValueError(f"worker {worker} pushed after leaving")
        self.pushes[worker] += 1
        if self.synchronous:
            self._round[worker] = payload
            return self._close_round()
        self._held.append(worker)
        step = self._release()
        step.apply, step.weight = [payload], 1.0 / self.num_workers
        return step

    def leave(self, worker: int) -> ServerStep:
        self.left.add(worker)
        return self._close_round() if self.synchronous else self._release()

    def waiting_for(self) -> list[int]:
        """Synchronous: the workers the open round still needs (for timeout errors)."""
        return sorted(self.active() - set(self._round))

    def _close_round(self) -> ServerStep:
        if not self._round or not self.active() <= set(self._round):
            return ServerStep()
        workers = sorted(self._round)
        payloads = [self._round[w] for w in workers]
        self._round.clear()
        return ServerStep(payloads, 1.0 / len(payloads), workers)

    def _release(self) -> ServerStep:
        active = self.active()
        slowest = min((self.pushes[w] for w in active), default=0)
        answer, still = [], []
        for worker in self._held:
            if worker in self.left or self.pushes[worker] - slowest <= self.staleness:
                answer.append(worker)
            else:
                still.append(worker)
        self._held = still
        return ServerStep(answer=answer)
