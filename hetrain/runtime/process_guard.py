"""Worker processes that die with their launcher, and exits described in words.

``die_with_parent`` makes a worker exit when its launcher dies for any reason
(SIGKILL included): on Linux the kernel delivers SIGKILL to the worker
(``prctl(PR_SET_PDEATHSIG)``); elsewhere a thread watches the parent's pid.
multiprocessing's ``daemon=True`` only reaps children on a normal interpreter
exit, so without this a killed ``hetrain train`` left its workers blocked for
good (docs/decisions.md, "Processes").
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


def die_with_parent(parent_pid: int) -> None:
    """Exit this process (SIGKILL) as soon as ``parent_pid`` is gone."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent_pid:  # the parent died before the prctl took effect
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="hetrain-parent-watch").start()


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
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
