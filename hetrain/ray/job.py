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
* the job ends by killing every actor and removing the placement group, whatever happened (the
  driver's own death ends them too: Ray ends the actors their owner leaves behind).
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
) -> JobResults:
    """Run ``fn(ctx, *args)`` on ``num_workers`` Ray actors (Ray initialised); return their results by rank.

    As :func:`hetrain.jobs.local_job.run_local` (see it for every argument), with ``placement``:
    the resources per worker, the driver's address, the actors' environment."""
    if on_failure not in ON_FAILURE_MODES:
        raise ValueError(f"on_failure must be abort, continue or respawn, got {on_failure!r}")
    job = RayJob(fn, args, num_workers, placement=placement, backend=backend, device=device, timeout_s=timeout_s,
                 job_timeout_s=job_timeout_s, on_failure=on_failure, log_path=log_path,
                 faults=[Fault(rank, "train", t) for t, rank in kills or []] + list(faults or []),
                 heartbeat_timeout_s=heartbeat_timeout_s, on_message=on_message, on_death=on_death,
                 on_join=on_join, worker_on_failure=worker_on_failure, on_members=on_members)
    results = job.run()
    results.launcher = {"launcher": "ray", "ray_placements": job.placements}
    return results


class RayJob(LocalJob):
    def __init__(self, fn, args: tuple, num_workers: int, *, placement: RayPlacement, **kwargs):
        self.placement = placement
        self.placements: dict = {}
        self._clocked: set = set()  # (rank, incarnation) whose silence clock started (see _find_hung)
        try:
            super().__init__(fn, args, num_workers, **kwargs)
        except BaseException:  # e.g. the placement group could not be placed: nothing of the job stays
            if getattr(self, "tmp", None):
                shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    def _make_workers(self, template: WorkerSpec) -> RayWorkers:
        return RayWorkers(template, self.placement)

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
