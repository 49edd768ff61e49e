"""Hop and D-PSGD in simulated time, driving the runtime's own :class:`HopWorker` objects.

Each worker loops, as the runtime does: (maybe skip) -> wait for a token from
every out-neighbour -> start -> compute (compute_s x slowdown) -> send its model
of iteration k to every out-neighbour -> wait until ``ready_to_average()`` ->
``complete()`` (average, return tokens to in-neighbours) -> next iteration.
Every decision (may I start, may I skip, which updates to average with which
weights, whom to give tokens) is the HopWorker's; this module only moves time
and messages: models of ``model_bytes`` and tokens of TOKEN_BYTES through the
network model, FIFO per (kind, src, dst) channel.

D-PSGD is HopWorker with HopConfig() (b = s = 0, no tokens).

Deaths (``--fail``): a killed worker stops at once (its unfinished computation
is lost, messages it already sent still arrive); every survivor adopts the
repaired graph (:func:`hetrain.protocols.membership.repair`, the runtime's own)
and its HopWorker is reconfigured, so nobody waits for the dead.
"""

from __future__ import annotations

from hetrain.protocols.hop_config import DPSGDOptions, HopOptions
from hetrain.protocols.hop_logic import make_hop_workers
from hetrain.protocols.lag_compensation import OwnProgress
from hetrain.protocols.membership import neighbour_weights, repair
from hetrain.sim.common import Recorder, SimSetup, SimulationError
from hetrain.sim.network import TOKEN_BYTES

IDLE, COMPUTING, WAITING, DONE, DEAD = 0, 1, 2, 3, 4


class HopSim:
    """Simulate ``setup.iterations`` Hop (or D-PSGD) iterations per worker on the options' graph."""

    def __init__(self, setup: SimSetup, options: HopOptions | DPSGDOptions):
        self.setup = setup
        topology, self.config = options.resolve(setup.num_workers)  # the defaults ``hetrain train`` uses
        self.workers = make_hop_workers(topology, self.config)
        self.topology = topology
        n = setup.num_workers
        self.state = [IDLE] * n
        self.compute_start = [0.0] * n
        self.rec = Recorder(n, setup.timelines, setup.progress)
        self.neighbors = [sorted(set(topology.in_neighbors[i]) | set(topology.out_neighbors[i])) for i in range(n)]
        self.last_sent: list[tuple | None] = [None] * n  # (iteration, payload) of each worker's last model sent
        keeps_progress = self.config.late_updates == "progress"  # put back the steps old updates would undo
        self.progress = [OwnProgress(w.progress_iterations_kept) if keeps_progress else None for w in self.workers]

    # ----- the worker loop ----------------------------------------------------------
    def _begin(self, i: int) -> None:
        """Skip if the HopWorker says so, then start the next iteration if tokens allow."""
        w = self.workers[i]
        engine = self.setup.engine
        math = self.setup.math
        while True:
            if w.iteration >= self.setup.exchange_limits[i]:  # its own steps reach --iterations (local_work auto)
                self._finish(i)
                return
            plan = w.plan_skip()
            if plan is None:
                break
            average = w.apply_skip(plan)
            engine.log("skip", i, (plan.from_iteration, plan.to_iteration))
            if math.enabled:
                math.apply_average(i, average, self.progress[i])
            self._send_tokens(i, average.tokens_to, average.token_count)
            # out-neighbours may be waiting for a skipped iteration's model: send this one (as the runtime does)
            self._send_model(i, w.iteration - 1, math.snapshot(i) if math.enabled else None)
        if not w.can_start():
            self.state[i] = IDLE
            if w.blocked_by_stopped_neighbors():  # a token source finished (a repair made it ours)
                self._finish(i)
            return
        w.start()
        self.state[i] = COMPUTING
        duration, steps = self.setup.work(i)
        self.compute_start[i] = engine.now
        engine.log("start", i, w.iteration)
        engine.after(duration, self._computed, i, duration, steps)

    def _computed(self, i: int, duration: float, steps: int = 1) -> None:
        if self.state[i] == DEAD:
            return  # killed mid-computation: the work is lost
        setup = self.setup
        engine, math = setup.engine, setup.math
        w = self.workers[i]
        k = w.iteration
        self.rec.computed(i, self.compute_start[i], duration, k, steps)
        engine.log("computed", i, k)
        payload = None
        if math.enabled:
            for _ in range(steps):
                math.local_step(i)
            payload = math.snapshot(i)
        self._send_model(i, k, payload)
        self.state[i] = WAITING
        self._try_complete(i)

    def _send_model(self, i: int, k: int, payload) -> None:
        """Worker ``i``'s model of iteration ``k`` to its out-neighbours (the runtime's ``_send_model``)."""
        engine, net = self.setup.engine, self.setup.network
        now, nbytes = engine.now, self.setup.message_bytes
        for m in self.workers[i].out_neighbors:
            engine.at(net.send(now, i, m, nbytes), self._update_arrives, m, i, k, payload)
        if self.progress[i] is not None and payload is not None:
            self.progress[i].sent(k, payload)
        self.last_sent[i] = (k, payload)

    def _try_complete(self, i: int) -> None:
        w = self.workers[i]
        if not w.ready_to_average():
            if w.blocked_by_stopped_neighbors():
                self._finish(i)
            return
        plan = w.complete()
        engine = self.setup.engine
        self.rec.completed(i, engine.now)
        engine.log("complete", i, (plan.iteration, tuple((t.src, t.iteration) for t in plan.terms)))
        math = self.setup.math
        if math.enabled:
            math.apply_average(i, plan, self.progress[i])
            math.maybe_evaluate(engine.now, self.rec.done)
        self._send_tokens(i, plan.tokens_to, plan.token_count)
        self._begin(i)

    def _send_tokens(self, i: int, to: list[int], count: int) -> None:
        engine, net = self.setup.engine, self.setup.network
        now = engine.now
        for j in to:
            engine.at(net.send(now, i, j, TOKEN_BYTES), self._tokens_arrive, j, i, count)

    # ----- arrivals -------------------------------------------------------------------
    def _update_arrives(self, dst: int, src: int, k: int, payload) -> None:
        if self.state[dst] == DEAD or src not in self.workers[dst].in_weights:
            return  # to the dead, or along an edge the repair removed
        self.workers[dst].receive_update(src, k, payload)
        state = self.state[dst]
        if state == WAITING:
            self._try_complete(dst)
        elif state == IDLE:
            self._begin(dst)  # a newer update may let it skip

    def _tokens_arrive(self, dst: int, src: int, count: int) -> None:
        if self.state[dst] == DEAD or src not in self.workers[dst].tokens:
            return
        self.workers[dst].receive_tokens(src, count)
        if self.state[dst] == IDLE:
            self._begin(dst)

    def _finish(self, i: int) -> None:
        if self.state[i] == DONE:
            return
        self.state[i] = DONE
        engine = self.setup.engine
        engine.log("finish", i, self.workers[i].iteration)
        self.rec.finished(i, engine.now)
        net, now = self.setup.network, engine.now
        for j in self.neighbors[i]:  # a stop message, behind everything sent before it (FIFO links)
            engine.at(net.send(now, i, j, TOKEN_BYTES), self._neighbor_stopped, j, i)

    def _neighbor_stopped(self, dst: int, src: int) -> None:
        if self.state[dst] == DEAD:
            return
        w = self.workers[dst]
        w.sender_finished(src)  # one FIFO link carries both kinds of message here
        w.token_source_finished(src)
        if self.state[dst] in (IDLE, WAITING) and w.blocked_by_stopped_neighbors():
            self._finish(dst)

    # ----- deaths ---------------------------------------------------------------------------
    def _kill(self, d: int) -> None:
        if self.state[d] in (DEAD, DONE):
            return
        self.state[d] = DEAD
        engine = self.setup.engine
        engine.log("killed", d, self.workers[d].iteration)
        self.rec.died(d, engine.now)
        self.topology = repair(self.topology, self.rec.dead)
        for i, w in enumerate(self.workers):
            if self.state[i] == DEAD:
                continue
            in_weights, self_weight, out = neighbour_weights(self.topology, i)
            if in_weights != w.in_weights or out != w.out_neighbors:
                new_in = set(in_weights) - set(w.in_weights)
                new_out = w.reconfigure(in_weights, self_weight, out)
                # new neighbours that finished before the repair made them ours never send us their STOP
                # (the runtime's _note_finished_neighbours)
                for j in new_in:
                    if self.state[j] == DONE:
                        w.sender_finished(j)
                for j in new_out:
                    if self.state[j] == DONE:
                        w.token_source_finished(j)
                self.neighbors[i] = sorted(set(in_weights) | set(out))
                if self.last_sent[i] is not None:  # new out-neighbours may wait for the model already sent
                    k, payload = self.last_sent[i]
                    net, now = self.setup.network, engine.now
                    for m in new_out:
                        engine.at(net.send(now, i, m, self.setup.model_bytes),  # a keyframe: the whole model
                                  self._update_arrives, m, i, k, payload)
                if self.state[i] == WAITING:
                    self._try_complete(i)
                elif self.state[i] == IDLE:
                    self._begin(i)

    # ----- running ----------------------------------------------------------------------
    def run(self) -> dict:
        engine = self.setup.engine
        for i in range(self.setup.num_workers):
            engine.at(0.0, self._begin, i)
        for time_s, worker in self.setup.kills:
            engine.at(time_s, self._kill, worker)
        cut = self.rec.run_engine(self.setup)
        stuck = [i for i, s in enumerate(self.state) if s not in (DONE, DEAD)]
        if stuck and not cut:
            i = stuck[0]
            raise SimulationError(f"simulated {len(stuck)} worker(s) deadlocked; worker {i} waits for "
                                  f"{self.workers[i].waiting_for()}")
        counters = [w.counters() for w in self.workers]
        return {"workers": self.rec.worker_records(counters), "wall_time_s": self.rec.wall_time_s(),
                "extra": {"topology": self.topology.name, "hop_config": vars(self.config).copy(),
                          **self.rec.failure_metrics()},
                "timeline": self.rec.timeline}


def make_sim(setup: SimSetup, options, seed: int) -> HopSim:
    """Hop (HopOptions) or D-PSGD (DPSGDOptions): the same defaults as ``hetrain train``."""
    return HopSim(setup, options)
