"""hetrain jobs on a Ray cluster: every worker a Ray actor, deaths of actors and nodes survived.

``hetrain train --launcher ray --ray-address ADDRESS`` (:mod:`hetrain.ray.training`) and, for your
own training function, :func:`run`. The driver (the process that calls them) hosts the job's store,
the Group Generator and the membership; the actors run the same worker code as a local job's
processes (:mod:`hetrain.ray.job`). Ray is an extra (``pip install 'hetrain[ray]'``), imported only
here, on use.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hetrain.jobs.heartbeat import DEFAULT_HEARTBEAT_TIMEOUT_S


def run(train_fn: Callable[..., Any], workers: int, *, on_failure: str = "continue", args: tuple = (),
        address: str | None = None, resources: dict | None = None, timeout_s: float = 60.0,
        heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S, job_timeout_s: float | None = None,
        backend: str = "gloo", device: str = "cpu",
        on_message: Callable[[int, Any], None] | None = None, log_path: str | os.PathLike | None = None,
        max_workers: int | None = None, joins: list[tuple[float, int]] | None = None,
        on_members: Callable[[str], None] | None = None):
    """Run ``train_fn(ctx, *args)`` on ``workers`` Ray actors; return their results by rank
    (:class:`hetrain.jobs.local_job.JobResults`: None for a rank that died for good; ``deaths``,
    ``joins``, and ``launcher["ray_placements"]``: each actor's node, pid and niceness, by ``"rank.incarnation"``).

    ``ctx`` is the :class:`hetrain.jobs.context.WorkerContext` a local worker gets: build the
    protocol with ``on_failure=ctx.on_failure, dead_workers=ctx.dead_workers``, call
    ``ctx.start_barrier()`` before the first step unless ``ctx.incarnation > 0`` (a replacement),
    and ``ctx.report({...})`` sends progress to ``on_message(rank, message)`` here.
    ``on_failure``: ``abort`` (a death fails the job), ``continue`` (the survivors go on) or
    ``respawn`` (and a replacement actor joins once the cluster has room for it).
    ``address``: the cluster to join, unless this process has called ``ray.init`` already (then
    that one, and it is left joined); ``resources``: what each worker reserves (default ``{"CPU": 1}``;
    e.g. ``{"CPU": 1, "GPU": 1}``). ``max_workers``: the job may grow to this many workers: one joins
    whenever the cluster has room for one more (``joins``, ``(training_time_s, count)`` pairs: on the
    training clock instead); build the protocol with ``on_failure=ctx.on_failure`` (``respawn``: new
    members are admitted as replacements are). A worker whose node is drained is asked to leave
    (``ctx.leave_requested()``; ``sync.leave()``). ``on_members(line)``: who joins or leaves, as it
    happens. The rest as :func:`hetrain.jobs.local_job.run_local`.
    """
    from hetrain.ray.connection import actor_env, connect
    from hetrain.ray.growth import check_growth

    check_growth(workers, max_workers, joins)  # bad input is refused before the cluster is joined
    host, joined = connect(address)
    try:
        from hetrain.ray.actors import RayPlacement
        from hetrain.ray.job import run_ray

        placement = RayPlacement(dict(resources or {"CPU": 1}), host, actor_env(host))
        return run_ray(train_fn, workers, args, placement=placement, backend=backend, device=device,
                       timeout_s=timeout_s, job_timeout_s=job_timeout_s, on_message=on_message,
                       log_path=log_path, on_failure=on_failure, heartbeat_timeout_s=heartbeat_timeout_s,
                       max_workers=max_workers, joins=joins, on_members=on_members)
    finally:
        if joined:
            import ray

            ray.shutdown()
