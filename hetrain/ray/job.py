"""A job whose workers are Ray actors: the local launcher's watch loop over :class:`RayWorkers`.

:func:`run_ray` takes :func:`hetrain.jobs.local_job.run_local`'s arguments, plus where the workers go
(:class:`hetrain.ray.actors.RayPlacement`), and returns the same :class:`JobResults`. The watch loop
is :class:`~hetrain.jobs.local_job.LocalJob`'s: a death (an actor that died, or every actor of a
node that was lost) is recorded and published to the survivors, who repair around it
(``continue``); with ``respawn`` a replacement actor for the rank starts one incarnation later on
the rank's placement-group bundle, wherever Ray places it, and joins as a local replacement does.
What differs from a local job:

* a worker is silent (for ``heartbeat_timeout_s``) only once its actor has run: a replacement
  waiting for capacity is not hung; until its first heartbeat (the payload's imports, which take
  seconds more on a loaded machine) it is heard by answering the driver's pings;
* a death is described with Ray's reason (``its node has died``, ``killed by ray.kill``) and the
  node it ran on;
* the job ends by killing every actor and removing the placement groups, whatever happened (the
  driver's own death ends them too: Ray ends the actors their owner leaves behind);
* a job that may grow (``max_workers``) starts a worker into a vacant rank as soon as the cluster has room
  for it (its own placement group is placed: a node was added, or another job freed some), once training
  has begun; with ``joins`` (``--join K@Ts``) the joins come on the training clock instead, as locally,
  each waiting for room if there is none;
* a worker whose node is being drained (:mod:`hetrain.ray.draining`) is asked to leave, and leaves as a
  local worker sent SIGTERM does: ``leaves``, not ``deaths`` (docs/decisions/ray-jobs-grow-and-drain.md).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from hetrain.faults import Fault
from hetrain.jobs.heartbeat import DEFAULT_HEARTBEAT_TIMEOUT_S, HEARTBEAT_INTERVAL_S
from hetrain.jobs.local_job import ON_FAILURE_MODES, JobResults, LocalJob
from hetrain.jobs.worker_process import WorkerSpec
from hetrain.ray import draining, growth
from hetrain.ray.actors import RayPlacement, RayWorkers


def run_ray(
    fn: Callable[..., Any],
    num_workers: int,
    args: tuple = (),
    *,
    placement: RayPlacement,
    backend: str = "gloo",
    device: str = "cpu",
    timeout_s: float = 60.0,
    job_timeout_s: float | None = None,
    on_message: Callable[[int, Any], None] | None = None,
    log_path: str | os.PathLike | None = None,
    on_failure: str = "abort",
    kills: list[tuple[float, int]] | None = None,
    faults: list[Fault] | None = None,
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
    on_death: Callable[[int], None] | None = None,
    on_join: Callable[[int, int], None] | None = None,
    worker_on_failure: str | None = None,
    on_members: Callable[[str], None] | None = None,
    max_workers: int | None = None,
    joins: list[tuple[float, int]] | None = None,
) -> JobResults:
    """Run ``fn(ctx, *args)`` on ``num_workers`` Ray actors (Ray initialised); return their results by rank.

    As :func:`hetrain.jobs.local_job.run_local` (see it for every argument), with ``placement``:
    the resources per worker, the driver's address, the actors' environment. ``max_workers``: the job
    grows to this many workers as the cluster has room for them (``joins``: on the training clock instead)."""
    if on_failure not in ON_FAILURE_MODES:
        raise ValueError(f"on_failure must be abort, continue or respawn, got {on_failure!r}")
    world = growth.check_growth(num_workers, max_workers, joins)
    job = RayJob(fn, args, world, start_workers=num_workers, joins=joins, placement=placement, backend=backend,
                 device=device, timeout_s=timeout_s, job_timeout_s=job_timeout_s, on_failure=on_failure,
                 log_path=log_path, faults=[Fault(rank, "train", t) for t, rank in kills or []] + list(faults or []),
                 heartbeat_timeout_s=heartbeat_timeout_s, on_message=on_message, on_death=on_death,
                 on_join=on_join, on_members=on_members,
                 worker_on_failure=worker_on_failure or ("respawn" if world > num_workers else on_failure))
    results = job.run()
    results.launcher = {"launcher": "ray", "ray_placements": job.placements}
    return results


class RayJob(LocalJob):
    def __init__(self, fn, args: tuple, num_workers: int, *, placement: RayPlacement, **kwargs):
        self.placement = placement
        self.placements: dict = {}
        self._clocked: set = set()  # (rank, incarnation) whose silence clock started (see _find_hung)
        self._joins_when_room = growth.joins_when_room(kwargs.get("joins"))
        self._asked_to_leave: set = set()  # (rank, incarnation) asked to leave: their node is draining
        self._next_drain_check = 0.0
        try:
            super().__init__(fn, args, num_workers, **kwargs)
        except BaseException:  # e.g. the placement group could not be placed: nothing of the job stays
            if getattr(self, "tmp", None):
                shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    def _make_workers(self, template: WorkerSpec) -> RayWorkers:
        return RayWorkers(template, self.placement, self.members.start_workers)

    def _watch_once(self) -> None:
        self._leave_draining_nodes()
        super()._watch_once()

    def _start_joins(self) -> None:
        """Start a worker into a vacant rank the cluster has made room for (its placement group placed), once
        training has begun, one at a time (:func:`hetrain.ray.growth.joins_now`); with a ``joins`` schedule,
        the local launcher's joins instead."""
        if not self._joins_when_room:
            return super()._start_joins()
        if self._ending() or not self.progress or not any(self.workers.alive(r) for r in range(self.n)):
            return
        for rank in growth.joins_now(self.workers.placed_vacant(self.members.vacant), self.replacements):
            self.members.take(rank)
            self._say(f"worker {rank} starts and joins the job: the cluster has room for it (at most {self.n} "
                      "workers)")
            self._start_member(rank, self._job_iteration())

    def _vacate(self, rank: int) -> None:
        """A rank whose worker left is vacant again once it has a placement group of its own to wait on (a rank
        that joined; a starting rank's room is the starting group's, so it stays gone)."""
        if self.workers.renew_vacancy(rank):
            super()._vacate(rank)

    def _leave_draining_nodes(self) -> None:
        """Ask each worker on a node being drained to leave the job (once; every ``DRAIN_POLL_S``): it
        leaves at its next step, as a local worker sent SIGTERM, before whoever drains the node ends it."""
        now = time.monotonic()
        if now < self._next_drain_check or self._ending():
            return
        self._next_drain_check = now + draining.DRAIN_POLL_S
        drained = draining.draining_nodes()
        if not drained:
            return
        for rank in range(self.n):
            key = self.workers.pid(rank)
            if (key in self._asked_to_leave or rank in self.done or self.channels.dead[rank]
                    or not self.workers.alive(rank) or self.workers.node_of(rank) not in drained):
                continue
            self._asked_to_leave.add(key)
            self._say(f"worker {rank}'s node is being drained: it leaves the job")
            self.workers.ask_to_leave(rank)

    def run(self) -> JobResults:
        try:
            return super().run()
        finally:
            self.placements = {f"{rank}.{incarnation}": where
                               for (rank, incarnation), where in self.workers.placements().items()}

    def _start(self, rank: int, *args) -> None:
        super()._start(rank, *args)
        self.silence.last_heard.pop(rank, None)  # clocked once its actor runs (it may wait for capacity)
        self.phases[rank] = set()  # and in start-up from then too (see _find_hung)

    def _find_hung(self) -> None:
        """An actor's silence counts from when it runs; until its first heartbeat, an answer to the driver's
        ping counts as one. Counted from its first beat (an earlier rule), an actor stopped or
        frozen before that beat was never found hung, and its peers failed the job at their timeout, even
        under continue; with one heartbeat timeout more for the first beat in its place, every actor of a
        loaded machine (torch's import alone took longer than 6 s) was found hung at ``--heartbeat-timeout
        3``. A ``--fail R@startup`` fault fires from then as well: sent at once, its SIGSTOP froze the
        actor, in one loaded run, before the answer of its ``where()`` call had left it, so the actor never
        read as running, and its neighbour failed the job at its timeout again."""
        now = time.monotonic()
        for rank in range(self.n):
            key = self.workers.pid(rank)
            if not self.workers.alive(rank):
                continue
            if key not in self._clocked:
                heard = rank in self.silence.last_heard  # its first beat may come before running() reads true
                if heard or self.workers.running(rank):
                    self._clocked.add(key)
                    self.silence.last_heard.setdefault(rank, now)
                    self.phases.setdefault(rank, set()).add("startup")
            elif rank not in self.silence.beating and self.workers.answered_ping(rank, HEARTBEAT_INTERVAL_S):
                self.silence.last_heard[rank] = max(self.silence.last_heard[rank], now)
        super()._find_hung()

    def _how(self, rank: int) -> tuple[str, str]:
        pid = self.workers.pid(rank)
        reason = self.workers.reason(rank)
        if pid in self.hung or pid in self.faults.injected or reason is None:
            return super()._how(rank)
        return f"its Ray actor died: {reason}", "signal"
