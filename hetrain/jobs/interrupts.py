"""Ctrl-C or SIGTERM in a local job: the first asks the workers to stop at their next iteration, a second kills them.

SIGTERM is how a scheduler asks a job to end (Slurm at its time limit or on ``scancel``, Kubernetes
and ``docker stop`` before their grace period's SIGKILL, systemd): it gets what Ctrl-C gets, the
workers' current state written (``metrics.json``, and the final checkpoint under
``--checkpoint-dir``), not a launcher gone at once with everything since the last checkpoint.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While installed (main thread only), SIGINT or SIGTERM sets ``stop`` (an event the workers poll) and
    starts a deadline of ``grace_s`` for them to stop; a second one raises KeyboardInterrupt.

    ``received``: the first signal's name (``"SIGINT"``, ``"SIGTERM"``), None if none came."""

    def __init__(self, stop, grace_s: float):
        self.stop = stop
        self.grace_s = grace_s
        self.count = 0
        self.received: str | None = None
        self.deadline: float | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def overdue(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline

    def _on_signal(self, signum, frame) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name
        self.stop.set()
        self.deadline = time.monotonic() + self.grace_s
        again = "Ctrl-C" if signum == signal.SIGINT else self.received
        print(f"\nhetrain: {self.received}: stopping the workers at their next iteration ({again} again to kill "
              f"them)", file=sys.stderr, flush=True)


def exit_code_for(signal_name: str | None) -> int:
    """The shell's convention for a process ended by a signal: 128 + its number (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + int(signal.Signals[signal_name or "SIGINT"])
