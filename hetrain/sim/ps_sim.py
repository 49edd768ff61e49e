"""A parameter server in simulated time (the baseline Prague is compared against).

As in the runtime (hetrain/prague/parameter_server.py) the server lives on
rank 0: rank 0's own pushes and pulls are local, every other one crosses rank
0's links, so n - 1 gradients queue on its ingress and n - 1 models on its
egress, which is what makes a PS scale poorly.

* ``staleness == 0``: synchronous. Every worker computes, pushes its gradient;
  when the server holds all n it applies their mean and sends the model back.
* ``staleness s > 0``: asynchronous with bounded staleness. The server applies
  each gradient as it arrives, scaled by 1/n so the step matches the synchronous
  mean, and replies with its current model, but holds the
  reply to a worker that would start an iteration more than s ahead of the
  slowest worker's pushes.

These rules mirror the runtime's; the decisions are re-implemented here (the
runtime's server is not written as separate pure logic).
"""

from __future__ import annotations

from hetrain.sim.common import Recorder, SimSetup


class ParameterServerSim:
    def __init__(self, setup: SimSetup, staleness: int = 0):
        self.setup = setup
        self.staleness = staleness
        n = setup.num_workers
        self.server = 0
        self.pushes = [0] * n
        self.held: list[int] = []  # workers whose reply waits for the slowest
        self.sync_arrived = 0
        self.compute_start = [0.0] * n
        self.rec = Recorder(n, setup.timelines, setup.progress)
        self.model = setup.math.snapshot(0) if setup.math.enabled else None
        self.sync_grads: list = []

    def _begin(self, i: int) -> None:
        setup = self.setup
        if self.pushes[i] >= setup.iterations:
            self.rec.finished(i, setup.engine.now)
            return
        duration = setup.compute_s * setup.slowdown.factor(i, self.pushes[i])
        self.compute_start[i] = setup.engine.now
        setup.engine.after(duration, self._computed, i, duration)

    def _computed(self, i: int, duration: float) -> None:
        setup = self.setup
        self.rec.computed(i, self.compute_start[i], duration, self.pushes[i])
        grad = setup.math.worker_gradient(i) if setup.math.enabled else None
        now = setup.engine.now
        arrival = now if i == self.server else setup.network.send(now, i, self.server, setup.model_bytes)
        setup.engine.at(arrival, self._push_arrives, i, grad)

    def _push_arrives(self, i: int, grad) -> None:
        setup = self.setup
        math = setup.math
        self.pushes[i] += 1
        if self.staleness == 0:
            self.sync_arrived += 1
            self.sync_grads.append(grad)
            if self.sync_arrived < setup.num_workers:
                return
            if math.enabled:
                import numpy as np

                self.model = self.model - math.lr * np.mean(self.sync_grads, axis=0)
                math.maybe_evaluate(setup.engine.now, self.rec.done)
            self.sync_arrived, self.sync_grads = 0, []
            for j in range(setup.num_workers):
                self._reply(j)
            return
        if math.enabled:
            self.model = self.model - math.lr * grad / setup.num_workers
            math.maybe_evaluate(setup.engine.now, self.rec.done)
        self.held.append(i)
        slowest = min(self.pushes)
        still_held = []
        for j in self.held:
            if self.pushes[j] - slowest <= self.staleness or self.pushes[j] >= setup.iterations:
                self._reply(j)
            else:
                still_held.append(j)
        self.held = still_held

    def _reply(self, j: int) -> None:
        setup = self.setup
        model = self.model.copy() if self.model is not None else None
        now = setup.engine.now
        arrival = now if j == self.server else setup.network.send(now, self.server, j, setup.model_bytes)
        setup.engine.at(arrival, self._pull_arrives, j, model)

    def _pull_arrives(self, j: int, model) -> None:
        if model is not None:
            self.setup.math.set_params(j, model)
        self._begin(j)

    def run(self) -> dict:
        engine = self.setup.engine
        for i in range(self.setup.num_workers):
            engine.at(0.0, self._begin, i)
        self.rec.run_engine(self.setup)
        mode = "synchronous" if self.staleness == 0 else f"asynchronous (staleness {self.staleness})"
        return {"workers": self.rec.worker_records(), "wall_time_s": self.rec.wall_time_s(),
                "extra": {"ps_mode": mode}, "timeline": self.rec.timeline}
