"""SIGTERM to one worker process: it asks to leave the job (docs/decisions/elastic-membership.md).

The handler only sets a flag; the worker's loop reads it between iterations and asks the launcher,
which lets the worker go, or, when the launcher got a SIGTERM too (a scheduler stops every process
of the job), stops the job as usual.
"""

from __future__ import annotations

import signal
import threading

_received = threading.Event()


def listen() -> None:
    """Install the handler (main thread of a worker process)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: _received.set())


def request() -> None:
    """Ask to leave without a signal (a Ray actor whose node is draining: the driver asks it)."""
    _received.set()


def received() -> bool:
    return _received.is_set()
