"""One worker process of a local job: what it is started with, and what it runs.

The launcher (:mod:`hetrain.jobs.local_job`) starts each worker with a
:class:`WorkerSpec` (its place in the job) and the job's :class:`JobChannels`
(the queues, events and shared arrays every worker holds). In the worker,
:func:`worker_main` names the process, ties its life to the launcher's, joins
the process group, runs ``fn(ctx, *args)`` and reports the result (or the
error) before leaving without interpreter teardown.

Workers are forked from a warm server (:mod:`hetrain.jobs.warm_start`) that
has imported torch and hetrain already; the spec carries the launcher's
environment, which the worker takes as its own, so a worker sees the
variables the launcher had when it started the worker (as with ``spawn``),
not those the server had when it started.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hetrain.errors import HetrainError, UsageError
from hetrain.jobs import leave_signal, mailboxes
from hetrain.jobs.heartbeat import start_heartbeat
from hetrain.jobs.interrupts import STOP_SIGNALS
from hetrain.jobs.process_guard import die_with_parent
from hetrain.jobs.shared_flag import SharedFlag

_PR_SET_NAME = 15


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker process is started with (picklable): its rank in the job and how to join it.

    ``launched_at``: the launcher's ``time.time()`` when it started this process (the worker's
    ``import_s`` counts from there); ``incarnation``, ``clock_offset_s``, ``start_iteration``:
    for a replacement (``respawn``), as :class:`hetrain.jobs.context.WorkerContext` describes.
    """

    fn: Callable[..., Any]
    args: tuple
    rank: int
    world_size: int
    store_path: str
    backend: str
    timeout_s: float
    on_failure: str
    launcher_pid: int
    launched_at: float
    env: dict = field(default_factory=dict)
    incarnation: int = 0
    clock_offset_s: float = 0.0
    start_iteration: int = 0
    hold_phases: tuple = ()  # phases a --fail fault awaits this process at (it waits there to be signalled)
    device: str = "cpu"  # cuda: this rank's GPU is rank modulo the GPUs (one each under NCCL)

    @property
    def name(self) -> str:
        return f"hetrain-w{self.rank}" + (f".{self.incarnation}" if self.incarnation else "")


@dataclass(frozen=True)
class JobChannels:
    """The launcher's shared objects, one set per job, handed to every worker.

    ``results``: (rank, kind, value, detail) once per worker; ``messages``: (rank, message) progress
    and membership reports; the flags (:class:`hetrain.jobs.shared_flag.SharedFlag`, which survive a
    killed worker): ``stop``: Ctrl-C was pressed; ``closing``: a worker is finishing, so no
    replacement joins from now on; ``dead``: a byte per rank, 1 while the launcher holds it dead;
    ``incarnations``: each rank's current process number; ``ready`` (a byte per rank) and ``go``:
    the start barrier (:mod:`hetrain.jobs.start_gate`); ``finished`` (a byte per rank) and
    ``stops`` (a byte per (sender, receiver) pair, bit 1: an update STOP, bit 2: a token STOP):
    which workers have finished and whom they told, so that a survivor whose neighbour finished
    before a repair made them neighbours does not wait for it (:class:`LauncherMembership`).
    """

    results: Any
    messages: Any
    stop: Any
    closing: Any
    dead: Any
    incarnations: Any
    ready: Any
    go: Any
    finished: Any
    stops: Any

    @classmethod
    def create(cls, context, num_workers: int) -> JobChannels:
        """The flags and arrays every process shares; the queues are each process's own (its launcher makes
        them as it starts it: hetrain.jobs.mailboxes)."""
        return cls(results=None, messages=None, stop=SharedFlag(context),
                   closing=SharedFlag(context), dead=context.Array("b", num_workers, lock=False),
                   incarnations=context.Array("i", num_workers, lock=False),
                   ready=context.Array("b", num_workers, lock=False), go=SharedFlag(context),
                   finished=context.Array("b", num_workers, lock=False),
                   stops=context.Array("b", num_workers * num_workers, lock=False))


def worker_main(spec: WorkerSpec, channels: JobChannels) -> None:
    """The body of a worker process (multiprocessing's target)."""
    os.environ.clear()
    os.environ.update(spec.env)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.update(LOCAL_RANK=str(spec.rank), LOCAL_WORLD_SIZE=str(spec.world_size))  # one node, as torchrun
    name_process(spec.name)
    die_with_parent(spec.launcher_pid)
    for stop_signal in STOP_SIGNALS:  # the launcher handles Ctrl-C and SIGTERM, and asks us to stop
        signal.signal(stop_signal, signal.SIG_IGN)
    leave_signal.listen()  # SIGTERM to this worker alone: it asks to leave (a stop if the launcher got one too)
    rank = spec.rank
    start_heartbeat(lambda: channels.messages.put((rank, {"heartbeat": True})))
    try:
        import torch.distributed as dist

        imported = time.time()
        report = lambda message: channels.messages.put((rank, message))  # noqa: E731
        ctx = join_job(spec, rank, dist.FileStore(spec.store_path, spec.world_size), channels, report, imported)
        result = spec.fn(ctx, *spec.args)
        mailboxes.post_result(channels.results, (rank, "ok", result, None), os.path.dirname(spec.store_path), spec.name)
        if spec.on_failure == "abort":
            dist.barrier()  # nobody leaves while another rank may still talk to it (a dead rank never would)
    except BaseException as exc:  # report every failure to the parent, then die
        kind = "usage" if isinstance(exc, UsageError) else "error"
        detail = traceback.format_exc()
        summary = str(exc) if isinstance(exc, HetrainError) else last_line(detail)
        mailboxes.post_result(channels.results, (rank, kind, summary, detail), os.path.dirname(spec.store_path), spec.name)
        _exit_now(1, channels.results, channels.messages)
    _exit_now(0, channels.results, channels.messages)


def join_job(spec: WorkerSpec, rank: int, store, channels, report, imported: float):
    """Join the job's default process group on ``store`` and build this worker's context from the
    launcher's ``channels`` (shared flags: deaths, incarnations, the start gate, the finish record) and
    ``report`` (a message to the launcher). ``imported``: when the worker's imports ended. The local
    launcher's processes and the Ray launcher's actors start alike."""
    import torch
    import torch.distributed as dist

    from hetrain.jobs.context import LauncherMembership, WorkerContext
    from hetrain.jobs.start_gate import StartGate
    from hetrain.transport.job import prefer_lazy_connections, select_gpu

    torch.set_num_threads(1)
    prefer_lazy_connections()
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    dist.init_process_group(spec.backend, store=store, rank=rank, world_size=spec.world_size, timeout=timeout)
    device = select_gpu(rank) if spec.device == "cuda" else torch.device("cpu")
    membership = None if spec.on_failure == "abort" else LauncherMembership(
        channels.dead, channels.incarnations, rank, spec.incarnation, report, channels.closing.wait,
        channels.finished, channels.stops, channels.ready, stopping=channels.stop.is_set)
    ctx = WorkerContext(rank, spec.world_size, device, spec.timeout_s, report=report,
                        start_gate=StartGate(channels.ready, channels.go, channels.dead, rank),
                        hold_phases=frozenset(spec.hold_phases),
                        stop_requested=channels.stop.is_set, dead_workers=membership,
                        continue_on_death=spec.on_failure != "abort", on_failure=spec.on_failure,
                        incarnation=spec.incarnation, clock_offset_s=spec.clock_offset_s,
                        start_iteration=spec.start_iteration, leave_requested=leave_signal.received,
                        phases={"launched_at": spec.launched_at,
                                "import_s": max(0.0, imported - spec.launched_at),
                                "connect_s": time.time() - imported})
    if spec.incarnation > 0:
        channels.ready[rank] = 1  # a replacement joins the running job; it never holds the start
    return ctx


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "unknown error"


def name_process(name: str) -> None:
    """Show the worker as ``hetrain-w3`` in ps/top (forked workers would otherwise all read like their server;
    a Ray actor like Ray's worker process). The name is a thread's: a Ray actor runs its tasks on a thread
    of its own, so the process's main thread, which ps and /proc/PID/comm show, is named through /proc."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
        except (OSError, AttributeError):
            pass
        if threading.current_thread() is not threading.main_thread():
            try:
                with open(f"/proc/{os.getpid()}/comm", "w") as handle:
                    handle.write(name[:15])
            except OSError:
                pass


def exit_without_teardown(code: int) -> None:
    """Flush stdio and leave without interpreter finalization.

    PyTorch 2.13's gloo/DDP objects destroyed during finalization sometimes abort
    the process ("terminate called without an active exception") after all work is
    done -- reproduced with a plain DDP script under torchrun (docs/decisions/local-job-processes.md).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_now(code: int, *queues) -> None:
    for q in queues:  # let the queues' feeder threads deliver what was put
        q.close()
        q.join_thread()
    exit_without_teardown(code)
