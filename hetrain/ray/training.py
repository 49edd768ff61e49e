"""``hetrain train --launcher ray``: the local job's training run, with Ray actors for workers.

Everything but the workers' start is :func:`hetrain.jobs.run.run_training`'s: the checks, the data
(loaded once here and handed to every actor), the Group Generator (served here, on the address the
actors reach the driver by), the progress bar, ``--log``, the evaluation and ``OUT/metrics.json``,
which also lists each worker's node (``ray_placements``). With ``--device cuda`` each worker reserves a
GPU unless ``--ray-worker-resources`` names GPU itself.
"""

from __future__ import annotations

from functools import partial

from hetrain.config import RunConfig


def run_training_ray(config: RunConfig, out_dir: str | None, address: str | None, resources: dict,
                     progress: bool = True, launched_at: float | None = None) -> dict:
    from hetrain.jobs.run import check_run_config, run_training
    from hetrain.ray.connection import actor_env, connect

    check_run_config(config, devices_here=False)  # bad input is refused before the cluster is joined
    host, joined = _connect_keeping_sigterm(connect, address)
    try:
        from hetrain.ray.actors import RayPlacement
        from hetrain.ray.job import run_ray

        if config.device == "cuda" and "GPU" not in resources:  # a GPU each, unless the resources say otherwise
            resources = {**resources, "GPU": 1.0}
        placement = RayPlacement(dict(resources), host, actor_env(host))
        return run_training(config, out_dir, progress=progress, launched_at=launched_at,
                            launch=partial(run_ray, placement=placement), service_host=host)
    finally:
        if joined:
            import ray

            ray.shutdown()


def _connect_keeping_sigterm(connect, address: str | None):
    """``ray.init`` makes a SIGTERM ``sys.exit(15)``; the command's own handling (a stop, exit 143:
    :mod:`hetrain.jobs.interrupts`) is put back, and Ray's shutdown still runs as the command leaves."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        return connect(address)
    finally:
        if main and previous is not None:
            signal.signal(signal.SIGTERM, previous)
