"""One worker of a Ray job: an actor whose ``run`` does what a local worker process does.

:func:`hetrain.jobs.worker_process.worker_main`'s steps, over the driver's store instead of the
launcher's shared memory (:mod:`hetrain.ray.channels`): take the launcher's environment, beat, join
the default process group on the driver's ``TCPStore``, build the :class:`WorkerContext` (with a
:class:`~hetrain.jobs.context.LauncherMembership` when deaths are survived), run ``fn(ctx, *args)``
and return ``(kind, value, detail)``: ``("ok", result, None)``, or the error's kind, one line and its
traceback. The actor stays alive after it returns, holding its connections, until the driver ends the
job: nobody leaves while another worker may still talk to it. The actor runs two threads
(``max_concurrency=2``), so ``signal_self`` reaches a busy worker (``--fail W@...:stop``), and so does
``ask_to_leave`` (the driver's ask when the actor's node is draining). A SIGTERM to the actor's process is a
leave too, as to a local worker's: the handler is installed by the constructor, which Ray runs on the
process's main thread (``run`` is not: ``signal.signal`` would refuse there).

If the driver's store stops answering, the driver is gone: the worker says so on stderr and exits
(Ray also ends the actors of a driver that died: they are owned by it).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from hetrain.errors import HetrainError, UsageError

_DRIVER_LOST_EXIT = 3


class WorkerActor:
    """The actor class (made remote by :class:`hetrain.ray.actors.RayWorkers`, with the job's resources)."""

    def __init__(self, env: dict):
        os.environ.update(env)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        # torch, the protocols and the training app, imported before the actor reads as running (its
        # where() answers after this): the driver clocks its silence from then, and torch's import, seconds
        # on a loaded machine with the GIL held, would leave it unable to beat or answer a ping
        import hetrain.jobs.warm  # noqa: F401
        from hetrain.jobs import leave_signal

        if threading.current_thread() is threading.main_thread():
            leave_signal.listen()  # SIGTERM to this actor's process: it asks to leave (Ray sends none of its own)

    def where(self) -> dict:
        """This actor's node, process and CPU priority (for the job's record)."""
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "niceness": os.nice(0)}

    def signal_self(self, signum: int) -> None:
        os.kill(os.getpid(), signum)

    def ask_to_leave(self) -> None:
        """Ask the job to let this worker go at its next step (``ctx.leave_requested()`` turns True)."""
        from hetrain.jobs import leave_signal

        leave_signal.request()

    def run(self, spec, store_address: tuple[str, int], secret: str, payload) -> tuple:
        return run_worker(spec, store_address, secret, *payload)


def run_worker(spec, store_address: tuple[str, int], secret: str, fn, args: tuple) -> tuple:
    """The body of ``WorkerActor.run``: returns (kind, value, detail) as a local worker's result message."""
    from hetrain.jobs.heartbeat import start_heartbeat
    from hetrain.jobs.worker_process import name_process
    from hetrain.ray.channels import WorkerChannels
    from hetrain.ray.driver_store import connect

    host, port = store_address
    rank = spec.rank
    name_process(spec.name)  # hetrain-wR (hetrain-wR.I for a replacement) in ps and /proc, as local workers

    def driver_lost(error) -> None:
        print(f"hetrain: worker {rank} lost the job's driver (its store at {host}:{port} stopped answering: "
              f"{error}); leaving", file=sys.stderr, flush=True)
        os._exit(_DRIVER_LOST_EXIT)

    try:
        channels = WorkerChannels(lambda: connect(host, port, spec.timeout_s), spec.world_size, rank,
                                  spec.incarnation, driver_lost, secret)
    except Exception as exc:  # noqa: BLE001 - reported as this worker's error
        return "error", f"worker {rank} could not reach the job's store at {host}:{port}: {exc}", \
            traceback.format_exc()
    start_heartbeat(lambda: channels.report({"heartbeat": True}))
    try:
        return "ok", _train(spec, channels, connect(host, port, spec.timeout_s), fn, args), None
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the driver
        kind = "usage" if isinstance(exc, UsageError) else "error"
        detail = traceback.format_exc()
        from hetrain.jobs.worker_process import last_line

        return kind, str(exc) if isinstance(exc, HetrainError) else last_line(detail), detail


def _train(spec, channels, store, fn, args):

    import torch.distributed as dist

    from hetrain.jobs.worker_process import join_job

    imported = time.time()
    ctx = join_job(spec, spec.rank, dist.PrefixStore("job/", store), channels, channels.report, imported)
    return fn(ctx, *args)
