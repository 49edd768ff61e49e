"""Prague and AD-PSGD in simulated time, driving the runtime's own group schedulers.

Each worker loops: compute (compute_s x slowdown) -> local step -> ask the
scheduler for groups -> run the returned groups' P-Reduces in order -> next
iteration. Who forms which group, and in what global order, is decided by the
same pure code the runtime serves to real jobs:
:class:`hetrain.protocols.group_generator.GroupGenerator` (every ``--gg`` mode) for
Prague, :class:`hetrain.protocols.adpsgd_pairing.ActivePassivePairing` for AD-PSGD.
This module supplies time and messages only:

* a request is a small message to the scheduler's endpoint (beside rank 0), served
  one at a time (``--gg-service-us`` each), and a reply back; ``--gg static`` computes
  its schedule locally (no messages);
* a P-Reduce starts when its last member arrives and every member's links are free;
  it costs a P-Reduce of the model over the group (network.collective; a direct
  exchange for small models, a ring all-reduce otherwise, as the runtime does),
  plus ``new_group_ms`` when the group's communicator is created (``comm_id == seq``:
  a cache miss on the members);
* a worker that reaches its last iteration ``leave``\\ s and runs the groups it still owes;
* with ``gg_prefetch_ms`` (Prague's default), the request leaves ``gg_prefetch_ms``
  before the compute is expected to end (:mod:`hetrain.protocols.request_timing`,
  as the runtime does), and an answer that arrives early waits for the compute;
* with ``preduce_overlap``, a step's groups run while the next step computes (the
  runtime's :mod:`~hetrain.groups.background_average`): the next sync waits for
  them, and the math adds ``average - snapshot`` to the worker's model.
"""

from __future__ import annotations

from collections import deque

from hetrain.protocols.request_timing import ComputeEstimate, ask_after_s
from hetrain.sim.common import Recorder, SimSetup, SimulationError

REQUEST_BYTES = 64  # a request or a reply line


class GroupSim:
    """Simulate a group-averaging protocol whose groups come from ``scheduler``."""

    def __init__(self, setup: SimSetup, scheduler, *, local_schedule: bool = False, name: str = "prague",
                 prefetch_ms: float = 0.0, overlap: bool = False):
        self.setup = setup
        self.scheduler = scheduler
        self.local = local_schedule
        self.name = name
        n = setup.num_workers
        self.gg_endpoint = n  # the first; a sharded scheduler's shard k is served at n + k
        self.gg_free_s: dict[int, float] = {}
        self.iteration = [0] * n
        self.leaving = [False] * n
        self.done = [False] * n
        self.pending: list[deque] = [deque() for _ in range(n)]
        self.arrived: dict[int, int] = {}  # group seq -> members arrived
        self.compute_start = [0.0] * n
        self.rec = Recorder(n, setup.timelines, setup.progress)
        self.groups_run = 0
        self.groups_failed = 0
        self.communicators_created = 0
        self.preduce_s = 0.0
        self.dead: set[int] = set()
        self.waiting_in: dict[int, object] = {}  # worker -> the group it arrived at and waits in
        self.running: set[int] = set()  # seq of groups whose P-Reduce is under way
        # asking before the compute ends: per worker None, "sent" (computing), "awaiting" (computed,
        # no answer yet) or "answered" (answer in early_groups, still computing)
        self.prefetch_ms = 0.0 if local_schedule else prefetch_ms
        self.estimate = [ComputeEstimate() for _ in range(n)]
        self.prefetch: list[str | None] = [None] * n
        self.early_groups: list = [None] * n
        # overlap: whose groups run in the background, who waits for them to sync, and (math) the
        # snapshot each averages and the buffer the averages update
        self.overlap = overlap
        self.in_background = [False] * n
        self.sync_deferred = [False] * n
        self.leave_deferred = [False] * n
        self.snapshot: dict[int, object] = {}
        self.shadow: dict[int, object] = {}

    # ----- the worker loop ------------------------------------------------------------
    def _begin(self, i: int) -> None:
        setup = self.setup
        if self.iteration[i] >= setup.exchange_limits[i]:
            if self.in_background[i]:  # leave once this worker's last groups are done
                self.leave_deferred[i] = True
                return
            self.leaving[i] = True
            self._run_groups(i, self.scheduler.leave(i, setup.engine.now))
            return
        duration, steps = setup.work(i)
        now = self.compute_start[i] = setup.engine.now
        estimate = self.estimate[i].value
        if self.prefetch_ms > 0 and estimate is not None and ask_after_s(estimate, self.prefetch_ms) < duration:
            setup.engine.after(ask_after_s(estimate, self.prefetch_ms), self._ask_early, i)
            self.prefetch[i] = "scheduled"
        self.estimate[i].add(duration)
        setup.engine.at(now + duration, self._computed, i, duration, steps)

    def _ask_early(self, i: int) -> None:
        if i in self.dead or self.prefetch[i] != "scheduled":
            return
        self.prefetch[i] = "sent"
        self._send_request(i)

    def _send_request(self, i: int) -> None:
        engine = self.setup.engine
        endpoint = self._endpoint(i)
        engine.at(self.setup.network.send(engine.now, i, endpoint, REQUEST_BYTES), self._gg_request, i, endpoint)

    def _endpoint(self, i: int) -> int:
        shard_of = getattr(self.scheduler, "endpoint", None)
        return self.gg_endpoint + (shard_of(i, self.setup.engine.now) if shard_of else 0)

    def _computed(self, i: int, duration: float, steps: int = 1) -> None:
        if i in self.dead:
            return  # killed mid-computation: the work is lost
        setup = self.setup
        engine = setup.engine
        k = self.iteration[i]
        self.rec.computed(i, self.compute_start[i], duration, k, steps)
        engine.log("computed", i, k)
        if setup.math.enabled:
            for _ in range(steps):
                setup.math.local_step(i)
            setup.math.maybe_evaluate(engine.now, self.rec.done)
        self.iteration[i] = k + 1
        if self.in_background[i]:  # the previous step's groups are still running: sync after them
            self.sync_deferred[i] = True
            return
        self._sync(i)

    def _sync(self, i: int) -> None:
        engine = self.setup.engine
        if self.local:
            self._run_groups(i, self.scheduler.request(i, engine.now))
            return
        asked, self.prefetch[i] = self.prefetch[i], None
        if asked == "sent":
            self.prefetch[i] = "awaiting"
        elif asked == "answered":
            self._run_groups(i, self.early_groups[i])
        else:
            self._send_request(i)

    def _gg_request(self, i: int, endpoint: int) -> None:
        engine = self.setup.engine
        service_s = self.setup.network.params.gg_service_us * 1e-6
        done = max(engine.now, self.gg_free_s.get(endpoint, 0.0)) + service_s  # one request at a time
        self.gg_free_s[endpoint] = done
        engine.at(done, self._gg_serve, i, endpoint)

    def _gg_serve(self, i: int, endpoint: int) -> None:
        if i in self.dead:
            return
        engine = self.setup.engine
        groups = self.scheduler.request(i, engine.now)
        nbytes = REQUEST_BYTES * (1 + len(groups))
        engine.at(self.setup.network.send(engine.now, endpoint, i, nbytes), self._answered, i, groups)

    def _answered(self, i: int, groups) -> None:
        if self.prefetch[i] == "sent":  # still computing: the groups wait for the step's end
            self.prefetch[i], self.early_groups[i] = "answered", groups
            return
        self.prefetch[i] = None
        self._run_groups(i, groups)

    def _run_groups(self, i: int, groups) -> None:
        if i in self.dead:
            return
        self.pending[i].extend(groups)
        if self.overlap and groups and not self.leaving[i]:  # they run while the next step computes
            self.in_background[i] = True
            math = self.setup.math
            if math.enabled:
                self.snapshot[i] = math.params[i].copy()
                self.shadow[i] = math.params[i].copy()
            self.rec.completed(i, self.setup.engine.now)
            self._next_group(i)
            self._begin(i)
            return
        self._next_group(i)

    def _background_done(self, i: int) -> None:
        self.in_background[i] = False
        math = self.setup.math
        if math.enabled:
            math.params[i] += self.shadow.pop(i) - self.snapshot.pop(i)
        if self.sync_deferred[i]:
            self.sync_deferred[i] = False
            self._sync(i)
        elif self.leave_deferred[i]:
            self.leave_deferred[i] = False
            self._begin(i)

    def _next_group(self, i: int) -> None:
        queue = self.pending[i]
        if not queue and self.in_background[i]:
            self._background_done(i)
            return
        if not queue:
            self.rec.completed(i, self.setup.engine.now)  # this iteration's averaging is done
            if self.leaving[i]:
                self._finish(i)
            else:
                self._begin(i)
            return
        group = queue.popleft()
        if self.dead.intersection(group.members):  # a member died: the others skip this group
            self.groups_failed += 1
            self._next_group(i)
            return
        count = self.arrived.get(group.seq, 0) + 1
        if count < len(group.members):
            self.arrived[group.seq] = count
            self.waiting_in[i] = group
            return
        self.arrived.pop(group.seq, None)
        setup = self.setup
        engine = setup.engine
        now = engine.now
        if group.comm_id == group.seq:  # first use of this communicator: members create it
            now += setup.network.params.new_group_ms / 1000.0
            self.communicators_created += 1
        self.running.add(group.seq)
        start, end = setup.network.collective(now, group.members, setup.message_bytes, preduce=True)
        self.preduce_s += end - start
        engine.log("preduce", -1, (group.seq, group.members))
        engine.at(end, self._group_done, group)

    def _group_done(self, group) -> None:
        self.running.discard(group.seq)
        for m in group.members:
            self.waiting_in.pop(m, None)
        if self.dead.intersection(group.members):  # a member died during the P-Reduce: it failed
            self.groups_failed += 1
            for m in group.members:
                if m not in self.dead:
                    self._next_group(m)
            return
        self.groups_run += 1
        math = self.setup.math
        if math.enabled:
            import numpy as np

            # a member running this group in the background averages its shadow buffer; one that runs
            # it in the foreground (a stopped worker's owed groups, or no overlap) its own model
            buffers = [self.shadow if m in self.shadow else math.params for m in group.members]
            mean = np.mean([b[m] for b, m in zip(buffers, group.members)], axis=0)
            for b, m in zip(buffers, group.members):
                b[m] = mean.copy()
        for m in group.members:
            self._next_group(m)

    def _kill(self, d: int) -> None:
        if d in self.dead or self.done[d]:
            return
        self.dead.add(d)
        engine = self.setup.engine
        engine.log("killed", d, self.iteration[d])
        self.rec.died(d, engine.now)
        self.done[d] = True
        self.pending[d].clear()
        self.scheduler.leave(d, engine.now)  # the GG stops grouping it; what it owed is void
        for i, group in list(self.waiting_in.items()):
            if d in group.members and i not in self.dead and group.seq not in self.running:
                # waiting for the dead in a group that never started: give up on it
                del self.waiting_in[i]
                self.arrived.pop(group.seq, None)
                self.groups_failed += 1
                self._next_group(i)

    def _finish(self, i: int) -> None:
        if not self.done[i]:
            self.done[i] = True
            self.setup.engine.log("finish", i, self.iteration[i])
            self.rec.finished(i, self.setup.engine.now)

    # ----- running ----------------------------------------------------------------------
    def run(self) -> dict:
        engine = self.setup.engine
        for i in range(self.setup.num_workers):
            engine.at(0.0, self._begin, i)
        for time_s, worker in self.setup.kills:
            engine.at(time_s, self._kill, worker)
        cut = self.rec.run_engine(self.setup)
        stuck = [i for i, d in enumerate(self.done) if not d]
        if stuck and not cut:
            raise SimulationError(f"{len(stuck)} worker(s) never finished; worker {stuck[0]} waits in group "
                                  f"{self.pending[stuck[0]][0] if self.pending[stuck[0]] else '?'}")
        stats = dict(self.scheduler.stats())
        stats.update({"groups_formed": stats.get("gg_groups_formed", self.groups_run), "groups_run": self.groups_run,
                      "groups_failed": self.groups_failed, "communicators_created": self.communicators_created,
                      "preduce_s": self.preduce_s, **self.rec.failure_metrics()})
        return {"workers": self.rec.worker_records(), "wall_time_s": self.rec.wall_time_s(),
                "extra": stats, "timeline": self.rec.timeline}


def make_prague_sim(setup: SimSetup, options, seed: int) -> GroupSim:
    """Prague from its :class:`~hetrain.protocols.prague_options.PragueOptions`, as the runtime builds it."""
    from hetrain.protocols.prague_options import scheduler_for

    return GroupSim(setup, scheduler_for(setup.num_workers, options, seed), local_schedule=options.local_schedule,
                    name="prague", prefetch_ms=options.gg_prefetch_ms, overlap=bool(options.preduce_overlap))


def make_adpsgd_sim(setup: SimSetup, options, seed: int) -> GroupSim:
    """AD-PSGD from its :class:`~hetrain.protocols.adpsgd_pairing.ADPSGDOptions`."""
    from hetrain.protocols.adpsgd_pairing import scheduler_for

    return GroupSim(setup, scheduler_for(setup.num_workers, options, seed), name="adpsgd")
