"""What every protocol simulation shares: its inputs and the per-worker record it fills."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hetrain.sim.engine import Engine
from hetrain.sim.network import Network
from hetrain.slowdown import Slowdown


class SimulationError(RuntimeError):
    """The simulated protocol could not finish (a deadlock): the message says who waits for what."""


@dataclass
class SimSetup:
    """Inputs of one simulated run.

    ``compute_s``: one iteration's compute time at full speed (seconds); worker i's
    iteration k takes ``compute_s * slowdown.factor(i, k)``. ``model_bytes``: the size
    of one model (or gradient) message.
    """

    num_workers: int
    iterations: int
    compute_s: float
    slowdown: Slowdown
    model_bytes: float
    engine: Engine
    network: Network
    math: object
    seed: int = 0
    time_budget_s: float | None = None  # stop every worker at this simulated time
    timelines: bool = False
    progress: Callable[[int], None] | None = None  # called with the number of new gradients
    kills: tuple = ()  # (time_s, worker): workers that die then (``--fail``), survivors continue
    local_steps: list | None = None  # per worker: local steps per exchange (``--sync-every``; None: 1 each)
    message_bytes: float | None = None  # one model message as sent (compressed); None: model_bytes
    # per worker: exchanges before it stops (``--local-work auto``: ``--iterations`` local steps at its own
    # steps per exchange, as the runtime stops each worker at K local steps); None: ``iterations`` each.
    # Prague, AD-PSGD and the parameter server honour it; Hop and D-PSGD stop at ``iterations``.
    exchange_limits: list | None = None

    def __post_init__(self):
        if self.local_steps is None:
            self.local_steps = [1] * self.num_workers
        if self.exchange_limits is None:
            self.exchange_limits = [self.iterations] * self.num_workers
        if self.message_bytes is None:
            self.message_bytes = self.model_bytes
        self._steps_done = [0] * self.num_workers

    def work(self, worker: int) -> tuple[float, int]:
        """(compute seconds, local steps) of ``worker``'s next exchange: its local steps, each
        ``compute_s`` times the slowdown factor of that step."""
        steps, first = self.local_steps[worker], self._steps_done[worker]
        self._steps_done[worker] = first + steps
        factor = self.slowdown.factor
        return sum(self.compute_s * factor(worker, first + j) for j in range(steps)), steps


@dataclass
class Recorder:
    """Per-worker counters: gradients computed, compute time, finish time, optional timeline."""

    num_workers: int
    timelines: bool = False
    progress: Callable[[int], None] | None = None
    iterations: list = field(init=False)
    compute_s: list = field(init=False)
    finish_s: list = field(init=False)
    timeline: list | None = field(init=False)
    done: int = 0

    def __post_init__(self):
        n = self.num_workers
        self.iterations = [0] * n
        self.compute_s = [0.0] * n
        self.finish_s = [None] * n
        self.timeline = [[] for _ in range(n)] if self.timelines else None
        self._pending = 0
        self.dead: set[int] = set()
        self.recoveries: list[dict] = []  # per death: when, who, and how long until every survivor moved on
        self._awaiting: list[tuple[dict, set]] = []

    def died(self, worker: int, time_s: float) -> None:
        """``worker`` was killed at ``time_s``: recovery ends when every survivor computes again."""
        self.dead.add(worker)
        self.finished(worker, time_s)
        event = {"worker": worker, "t_s": time_s, "recovery_s": None}
        self.recoveries.append(event)
        survivors = {w for w in range(self.num_workers) if w not in self.dead and self.finish_s[w] is None}
        self._awaiting.append((event, survivors))

    def completed(self, worker: int, time_s: float) -> None:
        """``worker`` finished an iteration (its averaging too): closes the recoveries it was awaited by."""
        if not self._awaiting:
            return
        still = []
        for event, waiting in self._awaiting:
            waiting.discard(worker)
            if waiting:
                still.append((event, waiting))
            else:
                event["recovery_s"] = time_s - event["t_s"]
        self._awaiting = still

    def computed(self, worker: int, start_s: float, duration_s: float, iteration: int, steps: int = 1) -> None:
        """Worker computed ``steps`` gradients (exchange ``iteration``) in [start_s, start_s + duration_s]."""
        self.iterations[worker] += steps
        self.compute_s[worker] += duration_s
        self.done += steps
        if self.timeline is not None:
            self.timeline[worker].append((start_s, start_s + duration_s, iteration))
        if self.progress is not None:
            self._pending += steps
            if self._pending >= 256:
                self.progress(self._pending)
                self._pending = 0

    def finished(self, worker: int, time_s: float) -> None:
        if self.finish_s[worker] is None:
            self.finish_s[worker] = time_s

    def flush(self) -> None:
        if self.progress is not None and self._pending:
            self.progress(self._pending)
            self._pending = 0

    def worker_records(self, counters: list[dict] | None = None) -> list[dict]:
        """One metrics.json worker dict each: wait_s is the time before finishing not spent computing."""
        records = []
        for i in range(self.num_workers):
            finish = self.finish_s[i] if self.finish_s[i] is not None else 0.0
            record = {"rank": i, "iterations": self.iterations[i], "compute_s": self.compute_s[i],
                      "wait_s": max(0.0, finish - self.compute_s[i]), "finish_s": finish}
            if counters is not None:
                record.update(counters[i])
            records.append(record)
        return records

    def run_engine(self, setup: SimSetup) -> bool:
        """Run ``setup.engine`` to the end or to the time budget; True when the budget cut the run.

        At the budget every worker still running stops where it is (an unfinished
        computation is not counted), as workers agreeing on a stop time would.
        """
        budget = setup.time_budget_s
        setup.engine.run(until_s=budget)
        self.flush()
        if setup.engine.stopped_at is not None:  # the model reached its target (SimOptions.math_stop_at_target)
            budget = setup.engine.stopped_at
        elif budget is None or not setup.engine.pending():
            return False
        for i in range(self.num_workers):
            self.finished(i, budget)
        return True

    def wall_time_s(self) -> float:
        alive = [t for w, t in enumerate(self.finish_s) if t is not None and w not in self.dead]
        return max(alive or [t for t in self.finish_s if t is not None] or [0.0])

    def failure_metrics(self) -> dict:
        return {"workers_lost": len(self.dead), "recoveries": self.recoveries}
