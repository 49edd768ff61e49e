"""Worker processes that die with their launcher, and exits described in words.

``die_with_parent`` makes a worker exit when its launcher dies for any reason
(SIGKILL included). A local job's workers are forked by a warm server
(:mod:`hetrain.jobs.warm_start`), itself a child of the launcher that exits
when the launcher does, so on Linux each worker asks the kernel for SIGKILL
when its own parent dies (``prctl(PR_SET_PDEATHSIG)``), and a thread also
watches the launcher's pid (in case the server outlives it, and on systems
without ``prctl``). multiprocessing's ``daemon=True`` only reaps children on
a normal interpreter exit, so without this a killed ``hetrain train`` left its
workers blocked for good (docs/decisions/no-orphans.md).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
_WATCH_INTERVAL_S = 0.5


def die_with_parent(launcher_pid: int) -> None:
    """Exit this process (SIGKILL) as soon as its parent, or ``launcher_pid``, is gone."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0 and os.getppid() != parent:
                os._exit(1)  # the parent died before the prctl took effect
        except (OSError, AttributeError):
            pass
    if not _alive(launcher_pid):
        os._exit(1)
    if launcher_pid != parent or not sys.platform.startswith("linux"):
        threading.Thread(target=_watch, args=(launcher_pid, parent), daemon=True,
                         name="hetrain-launcher-watch").start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch(launcher_pid: int, parent: int) -> None:
    while _alive(launcher_pid) and os.getppid() == parent:
        time.sleep(_WATCH_INTERVAL_S)
    os._exit(1)


def describe_exit(exitcode: int | None) -> str:
    """How a process ended, in words: 'was killed by SIGKILL (out of memory?)', 'exited with code 3'."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (killed by hand, or by the kernel's OOM killer: out of memory? see `dmesg`)" \
            if -exitcode == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {exitcode}"
