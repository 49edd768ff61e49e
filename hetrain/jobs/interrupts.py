"""Ctrl-C or SIGTERM in a local job: the first asks the workers to stop at their next iteration, a second kills them.

SIGTERM is how a scheduler asks a job to end (Slurm at its time limit or on ``scancel``, Kubernetes
and ``docker stop`` before their grace period's SIGKILL, systemd): it gets what Ctrl-C gets, the
workers' current state written (``metrics.json``, and the final checkpoint under
``--checkpoint-dir``), not a launcher gone at once with everything since the last checkpoint.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time

from hetrain.errors import Terminated

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[str] = []  # the stop signals this process took since :func:`forget_stops`, by name


def stop_received() -> str | None:
    """The first stop signal (``"SIGINT"``, ``"SIGTERM"``) taken since :func:`forget_stops`, or None: a
    comparison runs no further protocol after one, and the command's exit code says it came."""
    return _received[0] if _received else None


def forget_stops() -> None:
    _received.clear()


_watch_loops_begun = [0]  # jobs' watch loops entered in this process (held_after_the_job tells start-up by it)


class StopSignals:
    """While installed (main thread only), SIGINT or SIGTERM sets ``stop`` (an event the workers poll) and
    starts a deadline of ``grace_s`` for them to stop; a second one raises KeyboardInterrupt (Terminated for
    SIGTERM: exit 143, as for the first).

    ``received``: the first signal's name (``"SIGINT"``, ``"SIGTERM"``), None if none came; ``doing``: what
    the first one starts, in the line printed. ``stoppable=False``: for workers that never poll ``stop``
    (the planner's), the first signal leaves at once, as a second does."""

    watch_loop = True  # a job's watch loop (not the launcher's writing after it)

    def __init__(self, stop, grace_s: float, doing: str = "stopping the workers at their next iteration",
                 again: str = "to kill them", stoppable: bool = True):
        self.stop = stop
        self.grace_s = grace_s
        self.doing, self.again = doing, again
        self.stoppable = stoppable
        self.count = 0
        self.received: str | None = None
        self.deadline: float | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if self.watch_loop:
            _watch_loops_begun[0] += 1
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():  # None: one installed from C, not Python's to put back
            signal.signal(sig, signal.SIG_DFL if previous is None else previous)
        self._previous = {}

    def overdue(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline

    def _on_signal(self, signum, frame) -> None:
        self.count += 1
        if self.count > 1 or not self.stoppable:
            _received.append(signal.Signals(signum).name)
            raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        self.received = signal.Signals(signum).name
        _received.append(self.received)
        self.stop.set()
        self.deadline = time.monotonic() + self.grace_s
        again = "Ctrl-C" if signum == signal.SIGINT else self.received
        print(f"\nhetrain: {self.received}: {self.doing} ({again} again {self.again})", file=sys.stderr, flush=True)


class HeldWhileWriting(StopSignals):
    """For the launcher's work after its workers ended (evaluating their snapshots, writing the record): a
    first stop signal lets the record be written whole (and a comparison start no further run), a second
    leaves at once."""

    watch_loop = False

    def __init__(self, what: str = "the run's record"):
        super().__init__(threading.Event(), grace_s=math.inf, doing=f"the workers have ended; writing {what}",
                         again="to leave now")


class HeldAfterTheJob(HeldWhileWriting):
    """Installed around a job's launch and its record: the job's watch loop installs its own
    :class:`StopSignals` inside it, so there is no moment between the loop's end and the record's writing
    at which a stop signal finds neither. Before any watch loop began (start-up) a signal goes to the
    handler there before it (the command leaves at once, as it does in start-up)."""

    def __enter__(self) -> HeldAfterTheJob:
        self._loops_at_entry = _watch_loops_begun[0]
        return super().__enter__()

    def _on_signal(self, signum, frame) -> None:
        if _watch_loops_begun[0] == self._loops_at_entry:
            return _pass_on(self._previous.get(signum), signum, frame)
        return super()._on_signal(signum, frame)


def held_while_writing(what: str = "the run's record") -> StopSignals:
    return HeldWhileWriting(what)


def held_after_the_job() -> StopSignals:
    return HeldAfterTheJob()


def _pass_on(handler, signum, frame) -> None:
    """Do what ``handler`` (a signal's previous disposition) does for ``signum``."""
    if callable(handler):
        handler(signum, frame)
    elif handler != signal.SIG_IGN:  # the default (or one from C): put it back and take the signal again
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _raise_terminated(signum, frame) -> None:
    _received.append("SIGTERM")
    raise Terminated


def stop_on_sigterm() -> None:
    """From now on a SIGTERM raises :class:`Terminated` in this process (main thread only), where it would
    end it at once; a job's watch loop takes it as a stop instead (:class:`StopSignals`). Not for a rank
    under torchrun, whose agent stops ranks by SIGTERM and expects them gone."""
    forget_stops()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


def exit_code_for(signal_name: str | None) -> int:
    """The shell's convention for a process ended by a signal: 128 + its number (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + int(signal.Signals[signal_name or "SIGINT"])
