"""All-Reduce (DDP) in simulated time: synchronous, so each iteration has a closed form.

Iteration k: every worker computes (compute_s x slowdown factor), then the
gradient is ring all-reduced among all workers; the iteration ends at
``max_i(compute_i) + ring_allreduce_s(n, model_bytes)`` after it began, and all
workers start the next one together. With ``--math digits`` all workers hold
one model, updated with the mean of their gradients (what DDP computes).
"""

from __future__ import annotations

from hetrain.sim.common import Recorder, SimSetup
from hetrain.sim.network import ring_allreduce_s


class AllReduceSim:
    def __init__(self, setup: SimSetup):
        self.setup = setup
        self.rec = Recorder(setup.num_workers, setup.timelines, setup.progress)

    def _iteration(self, k: int) -> None:
        setup = self.setup
        engine, net = setup.engine, setup.network
        n, now = setup.num_workers, engine.now
        factor = setup.slowdown.factor
        budget = setup.time_budget_s
        longest = 0.0
        for i in range(n):
            duration = setup.compute_s * factor(i, k)
            if budget is None or now + duration <= budget:  # a computation the budget cuts is not counted
                self.rec.computed(i, now, duration, k)
            longest = max(longest, duration)
        engine.log("computed", -1, k)
        _, end = net.collective(now + longest, range(n), setup.message_bytes)
        engine.at(end, self._iteration_done, k)

    def _iteration_done(self, k: int) -> None:
        engine, math, n = self.setup.engine, self.setup.math, self.setup.num_workers
        engine.log("allreduced", -1, k)
        if math.enabled:  # applied when the all-reduce ends (one the budget cuts never updates the model)
            import numpy as np

            grad = np.mean([math.worker_gradient(i, math.params[0]) for i in range(n)], axis=0)
            model = math.params[0] - math.lr * grad
            for i in range(n):
                math.params[i] = model  # one shared array: every replica is identical under DDP
            math.maybe_evaluate(engine.now, self.rec.done)
        if k + 1 < self.setup.iterations:
            self._iteration(k + 1)
        else:
            for i in range(self.setup.num_workers):
                self.rec.finished(i, engine.now)

    def run(self) -> dict:
        self.setup.engine.at(0.0, self._iteration, 0)
        self.rec.run_engine(self.setup)
        return {"workers": self.rec.worker_records(), "wall_time_s": self.rec.wall_time_s(),
                "extra": {"allreduce_s": ring_allreduce_s(self.setup.num_workers, self.setup.message_bytes,
                                                    self.setup.network.params)}, "timeline": self.rec.timeline}


def make_sim(setup: SimSetup, options, seed: int) -> AllReduceSim:
    return AllReduceSim(setup)
