"""Ctrl-C in a local job: the first asks the workers to stop at their next iteration, the second kills them."""

from __future__ import annotations

import signal
import sys
import threading
import time


class CtrlC:
    """While installed (main thread only), SIGINT sets ``stop`` (an event the workers poll) and starts a
    deadline of ``grace_s`` for them to stop; a second SIGINT raises KeyboardInterrupt."""

    def __init__(self, stop, grace_s: float):
        self.stop = stop
        self.grace_s = grace_s
        self.count = 0
        self.deadline: float | None = None
        self._previous = None

    def __enter__(self) -> CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_interrupt)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def overdue(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline

    def _on_interrupt(self, signum, frame) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        self.stop.set()
        self.deadline = time.monotonic() + self.grace_s
        print("\nhetrain: stopping the workers at their next iteration (Ctrl-C again to kill them)",
              file=sys.stderr, flush=True)
