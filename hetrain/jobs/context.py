"""What the local launcher hands each worker function: its place in the job and a line to the launcher."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hetrain.errors import WorkerError
from hetrain.transport.job import DEFAULT_TIMEOUT_S
from hetrain.transport.membership import Membership

PHASE_HOLD_S = 10.0


@dataclass
class WorkerContext:
    """One local worker's view of :func:`hetrain.jobs.local_job.run_local`'s job.

    The default process group is initialised before ``fn(ctx, ...)`` runs, so
    protocols built inside take ``process_group=None``. ``report(message)``
    sends a picklable message to the launcher (progress); ``stop_requested()``
    turns True once the launcher asks the workers to stop (Ctrl-C);
    ``dead_workers()`` is the set of ranks the launcher has found dead, which
    the protocols repair around when ``continue_on_death`` (with ``respawn``
    it is a :class:`LauncherMembership`, which also says who came back).
    ``incarnation`` counts how many processes held this rank before this one
    (0: an original worker; more: a replacement, which joins a running job);
    ``clock_offset_s`` is the job's training time when this process started,
    ``start_iteration`` its predecessor's last reported iteration.
    ``leave_requested()`` turns True once this worker was asked to leave the job (SIGTERM to it alone;
    the protocol's ``leave()`` asks the launcher to let it go).
    ``start_gate``: the job's start barrier (:class:`hetrain.jobs.start_gate.StartGate`; None
    under torchrun, where ``dist.barrier()`` is one); ``phases``: start-up timing the launcher measured for this process (``launched_at``: the
    launcher's ``time.time()`` at its start; ``import_s`` until the worker's code ran;
    ``connect_s`` so far: the default process group); the training app adds its own.
    """

    rank: int
    world_size: int
    device: torch.device
    timeout_s: float = DEFAULT_TIMEOUT_S
    report: Callable[[object], None] | None = None
    stop_requested: Callable[[], bool] | None = None
    dead_workers: Callable[[], set[int]] | None = None  # ranks the launcher found dead (continue mode)
    continue_on_death: bool = False
    on_failure: str = "abort"
    incarnation: int = 0
    clock_offset_s: float = 0.0
    start_iteration: int = 0  # a replacement: its predecessor's last reported iteration
    phases: dict = field(default_factory=dict)
    start_gate: object | None = None
    hold_phases: frozenset = frozenset()  # phases where a --fail fault awaits this process
    leave_requested: Callable[[], bool] | None = None  # SIGTERM came to this worker: it asks to leave the job

    def enter_phase(self, name: str) -> None:
        """Tell the launcher this worker enters phase ``name``. If a ``--fail W@PHASE`` fault awaits it
        there, wait (up to ``PHASE_HOLD_S``) for the launcher's signal, so it lands in that phase and not
        after it (a small model's ``finish()`` takes milliseconds, the launcher polls every 50)."""
        if self.report is None:
            return
        self.report({"phase": name})
        if name in self.hold_phases:
            deadline = time.monotonic() + PHASE_HOLD_S
            while time.monotonic() < deadline:
                time.sleep(0.01)

    def start_barrier(self) -> None:
        """Wait until every worker of the job is ready to train (the dead excepted, in a local job)."""
        if self.start_gate is not None:
            self.start_gate.wait(self.timeout_s)
        else:
            import torch.distributed as dist

            dist.barrier()

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)


class LauncherMembership(Membership):
    """Who is in a local job, as the launcher's shared memory says (``continue`` and ``respawn``).

    Called, it returns the set of dead ranks (what protocols take as
    ``dead_workers``). ``incarnations()`` lists each rank's current process
    number: a rank that died and is alive again under a higher number was
    replaced, and its neighbours must talk to the new process over new
    communicators. ``incarnation`` is this process's own number;
    ``announce_joined()`` tells the launcher this replacement is ready (its
    communicators are posted), after which the others see it alive;
    ``announce_settled()``: it has taken the job's model from its neighbours (a replacement
    admitted and not settled when the membership closes is stopped: its neighbours, finishing,
    may never send it one); ``freeze(timeout_s)``, called as a worker finishes, ends admissions.
    ``record_finish(update_stops, token_stops)``: this worker is finishing and sends STOP to
    these ranks; ``finished_without_stop()``: the live ranks that finished without sending this
    one a STOP (update, token): a repair made them its neighbours after they had finished, so they
    will send it nothing more, and it must not wait for them.
    """

    def __init__(self, dead_flags, incarnation_counts, rank: int, incarnation: int,
                 report: Callable[[object], None], wait_frozen: Callable[[float], bool],
                 finished_flags=None, stop_flags=None, ready_flags=None, stopping: Callable[[], bool] | None = None):
        self._dead = dead_flags
        self._ready = ready_flags
        self._finished = finished_flags
        self._stops = stop_flags
        self._incarnations = incarnation_counts
        self.rank = rank
        self.incarnation = incarnation
        self._report = report
        self._wait_frozen = wait_frozen
        self._stopping = stopping or (lambda: False)  # Ctrl-C or SIGTERM reached the launcher
        self._frozen = False

    def dead(self) -> set[int]:
        return {w for w in range(len(self._dead)) if self._dead[w]}

    def incarnations(self) -> list[int]:
        return list(self._incarnations)

    def announce_joined(self, timeout_s: float) -> None:
        """Tell the launcher this replacement is ready; return once it is admitted (seen alive)."""
        self._report({"joined": self.incarnation})
        deadline = time.monotonic() + timeout_s
        while self._dead[self.rank]:
            if time.monotonic() > deadline:
                raise WorkerError(f"worker {self.rank} (a replacement) was not admitted to the job within "
                                  f"{timeout_s:.0f} s of joining")
            time.sleep(0.01)

    def announce_settled(self) -> None:
        self._report({"settled": self.incarnation})

    can_leave = True

    def ask_to_leave(self) -> None:
        """Ask the launcher to let this worker leave the job (it marks it gone, or ignores the ask when the
        job is ending)."""
        self._report({"leaving": self.incarnation})

    def let_go(self) -> bool:
        """Whether the launcher has let this worker go (the others route around it now)."""
        return bool(self._dead[self.rank])

    def ending(self) -> bool:
        """Whether the job is ending (a worker is finishing, or the launcher was told to stop): no one joins or
        leaves from now on."""
        return self._stopping() or bool(self._wait_frozen(0))

    def note_ready(self) -> None:
        """Mark this rank ready, as the start barrier does (a loop without the barrier: at its first step)."""
        if self._ready is not None:
            self._ready[self.rank] = 1

    def record_finish(self, update_stops, token_stops) -> None:
        """Before sending its STOPs: say whom they go to, then that this worker has finished."""
        if self._finished is None:
            return
        n = len(self._dead)
        for peer in update_stops:
            self._stops[self.rank * n + peer] |= 1
        for peer in token_stops:
            self._stops[self.rank * n + peer] |= 2
        self._finished[self.rank] = 1  # after the STOP records: a reader that sees it sees them

    def finished_without_stop(self) -> tuple[set[int], set[int]]:
        """(ranks that will send this worker no update STOP, nor a token STOP): finished, alive, and
        their STOP of that kind went to others."""
        if self._finished is None:
            return set(), set()
        n, me = len(self._dead), self.rank
        done = [w for w in range(n) if self._finished[w] and not self._dead[w] and w != me]
        return ({w for w in done if not self._stops[w * n + me] & 1},
                {w for w in done if not self._stops[w * n + me] & 2})

    def freeze(self, timeout_s: float) -> bool:
        """Say this worker is finishing and wait until the launcher stops admitting replacements
        (every finishing worker then reads the same members, but for deaths). False on timeout."""
        if not self._frozen:  # once: the final average freezes before its wait and again in it
            self._report({"finishing": True})
        self._frozen = self._wait_frozen(timeout_s)
        return self._frozen
