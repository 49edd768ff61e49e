"""Run a function on N local worker processes that form one torch.distributed job.

Used by ``hetrain train`` and by the tests. Rendezvous goes through a
``FileStore`` in a fresh temporary directory (no ports to pick). The parent
watches the children: the first one to fail, or a job that outlives its
deadline, kills every rank and raises :class:`WorkerError` naming the worker.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

from hetrain.errors import HetrainError, UsageError, WorkerError

_POLL_S = 0.05


def _child(fn, rank, world_size, store_path, backend, timeout_s, args, results, messages):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
        import torch.distributed as dist

        from hetrain.runtime.context import WorkerContext

        torch.set_num_threads(1)
        store = dist.FileStore(store_path, world_size)
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            device = torch.device("cuda", rank % torch.cuda.device_count())
        else:
            device = torch.device("cpu")
        ctx = WorkerContext(
            rank, world_size, device, timeout_s, dist.PrefixStore("hetrain/", store), rank, world_size
        )
        ctx.report = lambda message: messages.put((rank, message))
        result = fn(ctx, *args)
        results.put((rank, "ok", result))
        dist.barrier()  # nobody leaves while another rank may still talk to it
    except BaseException as exc:  # report every failure to the parent, then die
        kind = "usage" if isinstance(exc, UsageError) else "error"
        text = str(exc) if isinstance(exc, HetrainError) else traceback.format_exc(limit=6)
        results.put((rank, kind, text))
        _exit_now(1, results, messages)
    _exit_now(0, results, messages)


def exit_without_teardown(code: int) -> None:
    """Flush stdio and leave without interpreter finalization.

    PyTorch 2.13's gloo/DDP objects destroyed during finalization sometimes abort
    the process ("terminate called without an active exception") after all work is
    done -- reproduced with a plain DDP script under torchrun (docs/decisions.md).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_now(code: int, *queues) -> None:
    for q in queues:  # let the queues' feeder threads deliver what was put
        q.close()
        q.join_thread()
    exit_without_teardown(code)


def run_local(
    fn: Callable[..., Any],
    num_workers: int,
    args: tuple = (),
    *,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    job_timeout_s: float | None = None,
    on_message: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``num_workers`` processes; return their results by rank.

    ``ctx`` is a :class:`hetrain.runtime.context.WorkerContext` with a
    ``report(message)`` method that sends a picklable message to the parent,
    where ``on_message(rank, message)`` receives it (e.g. for a progress bar).
    ``timeout_s`` bounds each blocking wait inside the job; ``job_timeout_s``
    bounds the whole job (default: no bound beyond the per-wait timeouts).
    """
    ctx_mp = mp.get_context("spawn")
    results, messages = ctx_mp.Queue(), ctx_mp.Queue()
    tmp = tempfile.mkdtemp(prefix="hetrain-job-")
    store_path = os.path.join(tmp, "store")
    procs = [
        ctx_mp.Process(
            target=_child,
            args=(fn, rank, num_workers, store_path, backend, timeout_s, args, results, messages),
            daemon=True,
        )
        for rank in range(num_workers)
    ]
    deadline = None if job_timeout_s is None else time.monotonic() + job_timeout_s
    done: dict[int, Any] = {}
    try:
        for proc in procs:
            proc.start()
        while len(done) < num_workers:
            _drain_messages(messages, on_message)
            try:
                rank, kind, value = results.get(timeout=_POLL_S)
            except queue.Empty:
                dead = _dead_child(procs, done)
                if dead is not None:
                    try:  # its own error report usually arrives just after it dies
                        rank, kind, value = results.get(timeout=1.0)
                    except queue.Empty:
                        code = procs[dead].exitcode
                        raise WorkerError(
                            f"worker {dead} died with exit code {code} before reporting a result"
                        ) from None
                    _raise_if_failed(rank, kind, value)
                    done[rank] = value
                    continue
                if deadline is not None and time.monotonic() > deadline:
                    missing = sorted(set(range(num_workers)) - set(done))
                    raise WorkerError(
                        f"job did not finish within {job_timeout_s:.0f} s; still running: workers {missing}"
                    ) from None
                continue
            if kind == "error":  # a peer's death often surfaces first as a neighbour's lost connection
                _raise_if_another_died(procs, done, rank, value)
            _raise_if_failed(rank, kind, value)
            done[rank] = value
        _drain_messages(messages, on_message)
        for proc in procs:
            proc.join(timeout=timeout_s)
        return [done[rank] for rank in range(num_workers)]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            proc.join(timeout=5)
        shutil.rmtree(tmp, ignore_errors=True)


def _drain_messages(messages, on_message) -> None:
    while True:
        try:
            rank, message = messages.get_nowait()
        except queue.Empty:
            return
        if on_message is not None:
            on_message(rank, message)


def _dead_child(procs, done) -> int | None:
    for rank, proc in enumerate(procs):
        if rank not in done and proc.exitcode is not None and proc.exitcode != 0:
            return rank
    return None


def _raise_if_another_died(procs, done, failed_rank: int, failure: str, grace_s: float = 1.0) -> None:
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for rank, proc in enumerate(procs):
            if rank != failed_rank and rank not in done and proc.exitcode not in (None, 0):
                raise WorkerError(
                    f"worker {rank} died with exit code {proc.exitcode}; then worker {failed_rank} failed: "
                    f"{failure.strip().splitlines()[-1]}"
                )
        time.sleep(_POLL_S)


def _raise_if_failed(rank: int, kind: str, value) -> None:
    if kind == "usage":
        raise UsageError(value)
    if kind == "error":
        raise WorkerError(f"worker {rank} failed: {value.strip()}")
