"""A parameter server in simulated time (the baseline Prague is compared against).

As in the runtime (:mod:`hetrain.runtime.parameter_server`) the server lives on
rank 0: rank 0's own pushes and pulls are local, every other one crosses rank
0's links, so n - 1 gradients queue on its ingress and n - 1 models on its
egress, which is what makes a PS scale poorly. What the server applies and
whom it answers when is decided by the runtime's own pure
:class:`~hetrain.protocols.ps_logic.ParameterServerLogic` (synchronous with
staleness 0, stale-synchronous otherwise); this module supplies time, messages
and, with ``--math digits``, the model arithmetic (pushes are gradients here,
applied as ``model -= lr * weight * sum``).
"""

from __future__ import annotations

from hetrain.protocols.ps_logic import ParameterServerLogic, PSOptions, ServerStep
from hetrain.sim.common import Recorder, SimSetup


class ParameterServerSim:
    def __init__(self, setup: SimSetup, options: PSOptions):
        self.setup = setup
        self.staleness = staleness = options.staleness
        n = setup.num_workers
        self.server = 0
        self.logic = ParameterServerLogic(n, staleness)
        self.compute_start = [0.0] * n
        self.rec = Recorder(n, setup.timelines, setup.progress)
        self.model = setup.math.snapshot(0) if setup.math.enabled else None
        self.aborted: float | None = None  # when the server's death ended the job

    def _begin(self, i: int) -> None:
        setup = self.setup
        if self.logic.pushes[i] >= setup.exchange_limits[i]:
            self._carry_out(self.logic.leave(i))
            self.rec.finished(i, setup.engine.now)
            return
        duration, steps = setup.work(i)
        self.compute_start[i] = setup.engine.now
        setup.engine.after(duration, self._computed, i, duration, steps)

    def _computed(self, i: int, duration: float, steps: int = 1) -> None:
        if i in self.rec.dead or self.aborted is not None:
            return  # killed mid-computation, or the server died first: the work is lost
        setup = self.setup
        self.rec.computed(i, self.compute_start[i], duration, self.logic.pushes[i], steps)
        grad = setup.math.worker_gradient(i) if setup.math.enabled else None
        now = setup.engine.now
        arrival = now if i == self.server else setup.network.send(now, i, self.server, setup.message_bytes)
        setup.engine.at(arrival, self._push_arrives, i, grad)

    def _push_arrives(self, i: int, grad) -> None:
        if i in self.rec.dead or self.aborted is not None:
            return  # the push of a worker killed while it travelled (the server hears of the death first), or
            # of one pushing to a dead server
        self._carry_out(self.logic.push(i, grad))

    def _carry_out(self, step: ServerStep) -> None:
        math = self.setup.math
        if step.apply and math.enabled:
            for grad in step.apply:
                self.model = self.model - math.lr * step.weight * grad
            math.maybe_evaluate(self.setup.engine.now, self.rec.done)
        for j in step.answer:
            self._reply(j)

    def _reply(self, j: int) -> None:
        setup = self.setup
        model = self.model.copy() if self.model is not None else None
        now = setup.engine.now
        arrival = now if j == self.server else setup.network.send(now, self.server, j, setup.message_bytes)
        setup.engine.at(arrival, self._pull_arrives, j, model)

    def _pull_arrives(self, j: int, model) -> None:
        if j in self.rec.dead or self.aborted is not None:
            return
        self.rec.completed(j, self.setup.engine.now)
        if model is not None:
            self.setup.math.set_params(j, model)
        self._begin(j)

    def _kill(self, d: int) -> None:
        if d in self.rec.dead or self.rec.finish_s[d] is not None or self.aborted is not None:
            return
        now = self.setup.engine.now
        self.rec.died(d, now)
        if d == self.server:  # the server holds the only global model: the job cannot go on
            self.aborted = now
            for i in range(self.setup.num_workers):
                self.rec.finished(i, now)
            return
        self._carry_out(self.logic.leave(d))  # no longer waited for

    def run(self) -> dict:
        engine = self.setup.engine
        for i in range(self.setup.num_workers):
            engine.at(0.0, self._begin, i)
        for time_s, worker in self.setup.kills:
            engine.at(time_s, self._kill, worker)
        self.rec.run_engine(self.setup)
        mode = "synchronous" if self.staleness == 0 else f"asynchronous (staleness {self.staleness})"
        return {"workers": self.rec.worker_records(), "wall_time_s": self.rec.wall_time_s(),
                "extra": {"ps_mode": mode, "aborted_at_s": self.aborted, **self.rec.failure_metrics()},
                "timeline": self.rec.timeline}


def make_sim(setup: SimSetup, options, seed: int) -> ParameterServerSim:
    return ParameterServerSim(setup, options)
