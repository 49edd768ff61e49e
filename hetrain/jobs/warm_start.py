"""Workers that start warm: forked from a server that imported torch and hetrain once.

Starting a worker with ``spawn`` costs a fresh interpreter and every import
again (``import torch`` alone is 1-4 s here, and 8 workers on 2 cores pay it
8 times over). Local jobs instead start their workers with multiprocessing's
``forkserver``, preloaded with :mod:`hetrain.jobs.warm`: one server process
imports torch, torch.distributed, torch._dynamo (which torch's optimizers
import on first use), the runtime's protocols and the training app once, and
each worker -- a replacement under ``respawn`` too -- is a fork of it.

Why a forkserver and not a fork of the launcher (docs/decisions/warm-workers.md): the server is single-threaded and has never made a process group,
a CUDA context or a gloo connection, so a fork of it is safe with gloo and
CUDA; the launcher, by then, runs threads (the Group Generator's server, the
progress bar's monitor, queue feeders) whose locks a fork would copy held.

``HETRAIN_START_METHOD=spawn`` starts workers the old way (for comparison, or
where a forkserver is unavailable: then spawn is the fallback anyway, as it is
when the temp dir's path is too long for the server's AF_UNIX socket).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import tempfile

from hetrain.errors import UsageError

WARM_MODULES = ("hetrain.jobs.warm",)
START_METHOD_ENV = "HETRAIN_START_METHOD"
SERVER_ENV = "HETRAIN_WARM_SERVER"  # set in the server's environment only: it then leaves quickly (warm.py)
# The forkserver listens on an AF_UNIX socket at <tempdir>/pymp-XXXXXXXX/listener-XXXXXXXX (32 bytes
# after the temp dir); Linux takes a socket path of at most 107 bytes.
SOCKET_PATH_MAX = 107
SOCKET_SUFFIX_LEN = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
_warned_long_tempdir = False


def _tempdir_fits_a_socket() -> bool:
    global _warned_long_tempdir
    tempdir = os.fsencode(tempfile.gettempdir())
    if len(tempdir) + SOCKET_SUFFIX_LEN <= SOCKET_PATH_MAX:
        return True
    if not _warned_long_tempdir:
        _warned_long_tempdir = True
        print(
            f"hetrain: the temp dir ({len(tempdir)} bytes) is too long for the warm server's socket "
            f"(at most {SOCKET_PATH_MAX - SOCKET_SUFFIX_LEN}); workers start by spawn, which is slower. "
            "Set TMPDIR to a shorter path to start them warm.",
            file=sys.stderr,
        )
    return False


def start_method() -> str:
    chosen = os.environ.get(START_METHOD_ENV, "forkserver")
    if chosen not in ("forkserver", "spawn"):
        raise UsageError(f"{START_METHOD_ENV} must be forkserver or spawn, got {chosen!r}; unset it for forkserver")
    if chosen == "forkserver" and (chosen not in mp.get_all_start_methods() or not _tempdir_fits_a_socket()):
        return "spawn"
    return chosen


def worker_context():
    """The multiprocessing context local jobs start their workers with."""
    method = start_method()
    context = mp.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(list(WARM_MODULES))
    return context


def start_early() -> None:
    """Start the warm server now, so that its imports overlap the launcher's own work.

    Returns at once (the server imports in the background); the first worker
    started waits for it. One server serves every job of this process.
    """
    if start_method() == "forkserver":
        worker_context()
        from multiprocessing import forkserver, resource_tracker

        os.environ[SERVER_ENV] = "1"  # the server starts with this process's environment, now
        # and with SIGTERM blocked, a mask that fork and exec keep: a SIGTERM to the whole job in the
        # server's interpreter start-up waits, and hetrain.jobs.warm ignores it before unblocking it (here
        # it waits the few milliseconds of the spawn, then reaches the launcher's own handler). The same
        # guard CPython gives its resource tracker (bpo-33613), which ensure_running starts first and
        # whose start unblocks SIGTERM: so the tracker is started before the mask is set.
        resource_tracker.ensure_running()
        blocked = _block_sigterm()
        try:
            forkserver.ensure_running()
        finally:
            del os.environ[SERVER_ENV]
            if blocked is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _block_sigterm():
    """Block SIGTERM in this thread; the mask before, or None where masks are not Python's to set."""
    if not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
