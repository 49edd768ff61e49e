"""Run a function on N local worker processes that form one torch.distributed job.

Used by ``hetrain train``, the planner's ``--measure``/``profile`` and the
tests. Workers are forked from a warm server that has imported torch and
hetrain once (:mod:`hetrain.jobs.warm_start`), so a worker starts in tens of
milliseconds, not seconds. Rendezvous goes through a ``FileStore`` in a fresh
temporary directory (no ports to pick). The launcher watches the workers:

- the first failure (an error a worker reports, or a worker that dies) kills
  every rank and raises :class:`WorkerError` with one line naming the worker
  that failed first and how (:mod:`hetrain.jobs.failure_report`); every
  worker's full traceback goes to ``log_path`` when one is given;
- workers die with the launcher (:mod:`hetrain.jobs.process_guard`), so a
  killed launcher leaves no orphans;
- Ctrl-C (SIGINT) or SIGTERM asks the workers to stop at their next iteration
  (``ctx.stop_requested()``) and returns what they have, marked
  ``interrupted_by`` the signal; a second one kills them (:mod:`hetrain.jobs.interrupts`);
- with ``on_failure="continue"`` a worker that *dies* (exits without a
  result) does not end the job: the launcher records the death
  (:mod:`hetrain.jobs.deaths`), publishes it to the survivors through shared
  memory (``ctx.dead_workers()``; protocols repair around it) and waits for
  the others. A worker that *reports an error* still fails the job. ``faults``
  injects deaths and hangs for real (:mod:`hetrain.jobs.fault_injection`:
  SIGKILL or SIGSTOP on the training clock, the wall clock, or as a worker
  enters a phase it reports);
- a worker silent for ``heartbeat_timeout_s`` (no heartbeat: stopped, swapped
  out) is declared hung, SIGKILLed and handled as a death
  (:mod:`hetrain.jobs.heartbeat`);
- the start barrier is the launcher's (:mod:`hetrain.jobs.start_gate`): it
  opens once every rank is ready or dead, so a death during start-up leaves a
  job of the survivors;
- with ``on_failure="respawn"`` a death is handled as with ``continue`` and a
  replacement process starts for the same rank, one *incarnation* later. It
  builds its protocol, which announces ``{"joined": incarnation}``; only then
  does the launcher mark the rank alive again (``ctx.membership``), so the
  survivors connect to it and hand it the model (docs/decisions/respawn.md). No replacement starts once a worker has finished or Ctrl-C
  was pressed: the job is ending.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import time
from collections.abc import Callable
from typing import Any

from hetrain.errors import WorkerError
from hetrain.faults import Fault
from hetrain.jobs import start_gate
from hetrain.jobs.deaths import DeathRecords, Replacements
from hetrain.jobs.failure_report import failure_error, write_log
from hetrain.jobs.fault_injection import FaultSchedule
from hetrain.jobs.heartbeat import DEFAULT_HEARTBEAT_TIMEOUT_S, SilenceWatch
from hetrain.jobs.interrupts import StopSignals
from hetrain.jobs.job_dirs import make_job_dir
from hetrain.jobs.members import Members
from hetrain.jobs.process_guard import describe_exit
from hetrain.jobs.start_gate import open_if_ready
from hetrain.jobs.worker_process import WorkerSpec
from hetrain.jobs.workers import WorkerProcesses

_POLL_S = 0.05
_FAILURE_GRACE_S = 1.5  # after a first failure: time to hear from the rest (who died, who merely lost a peer)
_RESULT_GRACE_S = 2.0  # a worker that exited with code 0 and no result in this long ended early (os._exit(0))
ON_FAILURE_MODES = ("abort", "continue", "respawn")


class JobResults(list):
    """Results by rank (None for a worker that died, or a rank vacant at the end); ``earlier``: the results of
    workers that left a rank another worker then joined into; ``joins_not_started``: joins that found no
    vacant rank, or were not due, before the end; ``interrupted_by``: the signal's name when Ctrl-C or
    SIGTERM stopped the job early (``interrupted``: whether one did);
    ``joins``: each replacement or new member that joined (rank, incarnation, training time; ``new_member``);
    ``leaves``: each worker that left gracefully (rank, training time, ``wall_s`` from the job's start);
    ``deaths``: one dict per worker lost (rank, how, training time, recovery time of the survivors);
    ``last_progress``: each worker's last progress report; ``finished_at``: the ``time.time()`` at which
    the last result came in; ``launcher``: what the launcher adds to the run's record (a Ray job: where each
    worker ran)."""

    interrupted_by: str | None = None
    launcher: dict = {}
    finished_at: float | None = None
    deaths: list = []
    joins: list = []
    leaves: list = []
    earlier: list = []
    joins_not_started: int = 0
    last_progress: dict = {}

    @property
    def interrupted(self) -> bool:
        return self.interrupted_by is not None


def run_local(
    fn: Callable[..., Any],
    num_workers: int,
    args: tuple = (),
    *,
    backend: str = "gloo",
    device: str = "cpu",
    timeout_s: float = 60.0,
    job_timeout_s: float | None = None,
    on_message: Callable[[int, Any], None] | None = None,
    log_path: str | os.PathLike | None = None,
    on_failure: str = "abort",
    kills: list[tuple[float, int]] | None = None,
    faults: list[Fault] | None = None,
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
    on_death: Callable[[int], None] | None = None,
    on_join: Callable[[int, int], None] | None = None,
    stoppable: bool = True,
    max_workers: int | None = None,
    joins: list[tuple[float, int]] | None = None,
    worker_on_failure: str | None = None,
    on_members: Callable[[str], None] | None = None,
) -> JobResults:
    """Run ``fn(ctx, *args)`` on ``num_workers`` processes; return their results by rank.

    ``ctx`` is a :class:`hetrain.jobs.context.WorkerContext` with a
    ``report(message)`` method that sends a picklable message to the parent,
    where ``on_message(rank, message)`` receives it (e.g. for a progress bar),
    and ``stop_requested()``, which turns True after Ctrl-C.
    ``backend``: the process group's (gloo or nccl); ``device``: where each worker's ``ctx.device`` is
    (``cuda``: GPU rank modulo the GPUs).
    ``timeout_s`` bounds each blocking wait inside the job; ``job_timeout_s``
    bounds the whole job (default: no bound beyond the per-wait timeouts).
    ``log_path``: where a failed job writes every worker's full traceback.
    ``on_failure``: ``abort`` (a death fails the job), ``continue`` or ``respawn`` (see the
    module docstring); ``kills``: ``(training_time_s, rank)`` pairs to SIGKILL, ``faults``: any
    :class:`hetrain.faults.Fault`; ``heartbeat_timeout_s``: silence that makes a worker hung (0: never);
    ``on_death(rank)``
    runs in the launcher when a worker is found dead (e.g. to tell a Group Generator),
    ``on_join(rank, incarnation)`` when its replacement has joined.
    ``stoppable=False``: ``fn`` never polls ``stop_requested()`` (the planner's jobs), so a first Ctrl-C or
    SIGTERM ends the job at once, its workers killed, as a second one does.
    ``max_workers``: the job may grow to this many workers (ranks ``num_workers..max_workers-1`` start
    vacant; ``ctx.world_size`` is ``max_workers``); ``joins``: ``(training_time_s, count)``: start
    ``count`` new workers into the vacant ranks then, lowest first (a rank whose worker left is vacant
    again; a join that finds none waits for one: docs/decisions/elastic-membership.md).
    ``worker_on_failure``: what the workers' protocols are built for (default ``on_failure``; ``respawn``
    where new members join, ``continue`` where a worker may leave a job the launcher aborts on a death);
    ``on_members(line)``: a line saying who joins or leaves, as it happens.
    """
    if on_failure not in ON_FAILURE_MODES:
        raise ValueError(f"on_failure must be abort, continue or respawn, got {on_failure!r}")
    if max_workers is not None and max_workers < num_workers:
        raise ValueError(f"max_workers ({max_workers}) must be at least num_workers ({num_workers})")
    world = max_workers or num_workers
    if joins and world == num_workers:
        raise ValueError(f"joins add {sum(k for _, k in joins)} workers to a job of {num_workers} that cannot grow: "
                         "give max_workers")
    return LocalJob(fn, args, world, start_workers=num_workers, joins=joins,
                    worker_on_failure=worker_on_failure or ("respawn" if world > num_workers else on_failure),
                    backend=backend, device=device, timeout_s=timeout_s,
                    job_timeout_s=job_timeout_s,
                    on_failure=on_failure, log_path=log_path,
                    faults=[Fault(rank, "train", t) for t, rank in kills or []] + list(faults or []),
                    heartbeat_timeout_s=heartbeat_timeout_s, on_message=on_message,
                    on_death=on_death, on_join=on_join, on_members=on_members, stoppable=stoppable).run()


class LocalJob:
    """The launcher's watch loop over one job's workers: results, progress, deaths, joins and the end."""

    def __init__(self, fn, args: tuple, num_workers: int, *, backend: str, timeout_s: float, device: str = "cpu",
                 job_timeout_s: float | None, on_failure: str, log_path, faults: list[Fault],
                 heartbeat_timeout_s: float, on_message, on_death, on_join, stoppable: bool = True,
                 on_members=None, start_workers: int | None = None, joins: list[tuple[float, int]] | None = None,
                 worker_on_failure: str | None = None):
        self.n = num_workers  # the job's ranks: its largest size
        self.members = Members(num_workers, num_workers if start_workers is None else start_workers, joins)
        self.on_failure = on_failure
        self.continue_on_death = on_failure != "abort"
        self.timeout_s = timeout_s
        self.job_timeout_s = job_timeout_s
        self.log_path = log_path
        self.faults = FaultSchedule(faults)
        self.phases: dict[int, set[str]] = {}  # rank -> phases its current process has entered
        self.silence = SilenceWatch(heartbeat_timeout_s)
        self.hung: dict[int, float] = {}  # pid -> seconds of silence when it was declared hung
        self._quiet_exits: dict[int, float] = {}  # pid -> when it was first seen exited with code 0 and no result
        self.launched = time.monotonic()
        self.on_message, self.on_death, self.on_join, self.on_members = on_message, on_death, on_join, on_members
        self.tmp = make_job_dir()
        self.workers = self._make_workers(WorkerSpec(
            fn=fn, args=args, rank=0, world_size=num_workers, store_path=os.path.join(self.tmp, "store"),
            backend=backend, device=device, timeout_s=timeout_s, on_failure=worker_on_failure or on_failure,
            launcher_pid=os.getpid(),
            launched_at=0.0))
        self.channels = self.workers.channels
        self.done: dict[int, Any] = {}
        self.earlier: list = []  # results of workers that left a rank joined again since
        self._said_waiting = 0  # joins due and waiting for a vacant rank, as last said
        self.failures: dict[int, tuple[str, str, str | None]] = {}  # rank -> (kind, summary, detail)
        self.deaths = DeathRecords(started_at=self.launched)
        self.replacements = Replacements()
        self.gone: set[int] = set()  # ranks dead for good (no replacement)
        self.started_t_s: dict[int, float] = {}  # rank -> training time its current process started
        self.progress: dict[int, dict] = {}  # rank -> its last progress report (with "at": launcher clock)
        self.interrupt = StopSignals(self.channels.stop, grace_s=timeout_s, stoppable=stoppable)
        self.finished_at: float | None = None

    def _make_workers(self, template: WorkerSpec):
        """The workers' processes (a Ray job's launcher gives actors: :mod:`hetrain.ray.job`)."""
        return WorkerProcesses(template)

    # -- the watch loop ------------------------------------------------------------
    def run(self) -> JobResults:
        deadline = None if self.job_timeout_s is None else time.monotonic() + self.job_timeout_s
        try:
            with self.interrupt:
                self.launched = self.deaths.started_at = self.members.started_at = time.monotonic()  # the job's start
                for rank in self.members.vacant:
                    self.channels.dead[rank] = 1  # no process yet: the others route around it from the start
                for rank in range(self.members.start_workers):
                    self._start(rank)
                while len(self._ended()) < self.n:
                    self._watch_once()
                    now = time.monotonic()
                    if deadline is not None and now > deadline:
                        raise WorkerError(f"job did not finish within {self.job_timeout_s:.0f} s; still running: "
                                          f"workers {self._missing()}")
                    if self.interrupt.overdue(now):
                        raise WorkerError(f"interrupted: workers {self._missing()} did not stop within "
                                          f"{self.timeout_s:.0f} s of {self.interrupt.received}")
                self.finished_at = time.time()
                self._drain_messages()
                self.workers.join(self.timeout_s)
            if len(self.gone | set(self.members.vacant)) == self.n:
                last = self.deaths.last_cause()
                raise WorkerError(f"every worker died; the last, worker {last['rank']}, {last['how']}")
            return self._results()
        finally:
            self.workers.kill_all()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _watch_once(self) -> None:
        self._drain_messages()
        open_if_ready(self.channels.ready, self.channels.dead, self.channels.go)
        self._collect(_POLL_S)
        self._inject_faults()
        self._find_hung()
        dead = [r for r in self._dead_without_result()
                if not self.deaths.known(r, self.channels.incarnations[r])]
        if self.continue_on_death and dead and not self.failures:
            for rank in dead:
                self._record_death(rank)
            self._note_recoveries()
        elif self.failures or dead:
            self._fail()
        self._grant_leaves()
        self._vacate_left()
        self._start_joins()
        self._admit_deferred()

    def _results(self) -> JobResults:
        results = JobResults(self.done.get(rank) for rank in range(self.n))
        results.interrupted_by = self.interrupt.received
        results.deaths = self.deaths.public()
        results.joins = list(self.replacements.joined)
        results.leaves = list(self.members.left)
        results.earlier = list(self.earlier)
        results.joins_not_started = self.members.waiting(float("inf"))
        results.last_progress = dict(self.progress)
        results.finished_at = self.finished_at
        return results

    def _collect(self, wait_s: float) -> None:
        """Every result and error report waiting (the first waited for up to ``wait_s``): one left queued
        behind another made its rank, exited by then, read as dead without a report."""
        try:
            item = self.channels.results.get(timeout=wait_s)
            while True:
                rank, kind, value, detail = item
                if kind == "ok":
                    self.done[rank] = value
                else:
                    self.failures.setdefault(rank, (kind, value, detail))
                item = self.channels.results.get_nowait()
        except queue.Empty:
            return

    def _drain_messages(self) -> None:
        while True:
            try:
                rank, message = self.channels.messages.get_nowait()
            except queue.Empty:
                return
            self.silence.heard(rank)
            if isinstance(message, dict) and "heartbeat" in message:
                continue
            if isinstance(message, dict) and "phase" in message:
                self.phases.setdefault(rank, set()).add(message["phase"])
                continue
            if isinstance(message, dict) and "joined" in message:
                self._joined(rank, message["joined"])
                continue
            if isinstance(message, dict) and "settled" in message:
                self.replacements.settled(rank, message["settled"])
                continue
            if isinstance(message, dict) and "finishing" in message:
                self._close_membership()
                continue
            if isinstance(message, dict) and "leaving" in message:
                self.members.wants_to_leave(rank, message["leaving"])
                continue
            if isinstance(message, dict):
                self.progress[rank] = dict(message, at=time.monotonic())
                self._note_recoveries()
            if self.on_message is not None:
                self.on_message(rank, message)

    # -- deaths (continue and respawn), replacements and injected kills -----------------------------
    def _training_time_s(self) -> float:
        return max((p.get("t_s", 0.0) for p in self.progress.values()), default=0.0)

    def _start(self, rank: int, *args) -> None:
        holds = tuple(f.phase for f in self.faults.pending if f.clock == "phase" and f.worker == rank)
        self.workers.start(rank, *args, hold_phases=holds)
        self.phases[rank] = {"startup"}
        self.silence.started(rank)

    def _inject_faults(self) -> None:
        training = self._training_time_s() if self.progress else None
        for fault in self.faults.due(training, time.monotonic() - self.launched, self.phases):
            rank = fault.worker
            if rank in self.done or not self.workers.alive(rank):
                continue
            self.faults.injected[self.workers.pid(rank)] = fault
            self.workers.signal(rank, signal.SIGSTOP if fault.signal == "stop" else signal.SIGKILL)

    def _find_hung(self) -> None:
        """SIGKILL workers silent past the heartbeat timeout; their deaths then say they hung."""
        running = [r for r in range(self.n) if r not in self.done and r not in self.failures and self.workers.alive(r)]
        for rank, silent_s in self.silence.silent(running).items():
            self.hung[self.workers.pid(rank)] = silent_s
            self.workers.kill(rank)

    def _how(self, rank: int) -> tuple[str, str]:
        """(how ``rank``'s current process ended, in words; its cause: injected, hung, signal or exit)."""
        pid = self.workers.pid(rank)
        fault = self.faults.injected.get(pid)
        if pid in self.hung:
            stopped = f", stopped by --fail {fault.describe()}" if fault is not None else ""
            return (f"hung: no heartbeat for {self.hung[pid]:.0f} s (--heartbeat-timeout {self.silence.timeout_s:g})"
                    f"{stopped}; killed", "hung")
        if fault is not None:
            return f"was killed by --fail {fault.describe()} (SIGKILL)", "injected"
        code = self.workers.exitcode(rank)
        if code == 0:
            return "exited (code 0) without a result: os._exit() or sys.exit() in the job?", "exit"
        return describe_exit(code), "signal" if code is not None and code < 0 else "exit"

    def _record_death(self, rank: int) -> None:
        dead_flags, incarnation = self.channels.dead, self.channels.incarnations[rank]
        self.replacements.forget(rank)  # a replacement that died before joining
        if self.members.is_leaving(rank, incarnation):  # it was let go: its end is a leave, not a death
            self.members.ended_without_result(rank)
            self.gone.add(rank)
            return
        if self.workers.pid(rank) in self.replacements.stopped_pids:
            self.gone.add(rank)
            self.deaths.not_admitted(rank, incarnation)
            return
        dead_flags[rank] = 1  # the survivors see it at their next check
        alive = [r for r in range(self.n) if r != rank and r not in self.done and not dead_flags[r]]
        how, cause = self._how(rank)
        t_s = self._training_time_s()  # its own last report counts: the job had reached it
        self.deaths.died(rank, incarnation, how, cause, self.started_t_s.get(rank, 0.0), self.progress.pop(rank, {}),
                         t_s, {r: self.progress.get(r, {}).get("computed", 0) for r in alive})
        if self.on_death is not None:
            self.on_death(rank)
        if self.on_failure == "respawn" and not self._ending() and alive:
            self._respawn(rank)
        else:
            self.gone.add(rank)

    # -- membership beyond deaths: joins into vacant ranks, graceful leaves ---------------------------
    def _start_joins(self) -> None:
        """Start the workers ``joins`` calls for now, each into the lowest vacant rank, as a replacement starts
        (it stays dead to the others until it announces it joined, then is admitted one at a time)."""
        if self._ending() or not any(self.workers.alive(r) for r in range(self.n)):
            return
        now_s = self._training_time_s() if self.progress else None
        for rank in self.members.due(now_s):
            self._say(f"worker {rank} starts and joins the job (at most {self.n} workers)")
            self._start_member(rank, self._job_iteration())
        waiting = self.members.waiting(now_s)
        if waiting and waiting != self._said_waiting:
            self._say(f"{waiting} join(s) wait for a vacant rank: every one of the job's {self.n} ranks has a "
                      "worker (a worker that leaves frees its rank)")
        self._said_waiting = waiting

    def _job_iteration(self) -> int:
        """The iteration the live workers have reached (a new member counts on from it)."""
        return max((p.get("iteration", 0) for r, p in self.progress.items() if not self.channels.dead[r]), default=0)

    def _vacate_left(self) -> None:
        """Each rank whose worker was let go and has ended (its process exited, its result in or not) is
        vacant again: a later join may take it."""
        for rank, incarnation in self.members.leaving.items():
            if (self.channels.incarnations[rank] == incarnation and rank not in self.members.vacant
                    and (rank in self.done or rank in self.gone) and self.workers.exitcode(rank) is not None):
                self._vacate(rank)

    def _vacate(self, rank: int) -> None:
        """The worker let go from ``rank`` ended: the rank is vacant again (a Ray job: once it has room of
        its own for a new worker, :meth:`hetrain.ray.job.RayJob._vacate`)."""
        self.members.vacate(rank)

    def _start_member(self, rank: int, iteration: int) -> None:
        """Start the next process of ``rank`` (a replacement, or a new member of a vacant rank)."""
        if rank in self.done:  # a worker that left the rank before: its result is kept beside the rank's
            self.earlier.append(self.done.pop(rank))
        self.gone.discard(rank)
        incarnation = self.channels.incarnations[rank] + 1
        self.channels.incarnations[rank] = incarnation
        self.channels.finished[rank] = 0  # a predecessor that finished, then died: the replacement has not
        for peer in range(self.n):
            self.channels.stops[rank * self.n + peer] = 0
        t_s = self._training_time_s()
        self.started_t_s[rank] = t_s
        self._start(rank, incarnation, t_s, iteration)
        self.replacements.started(rank, incarnation, t_s, new_member=self.members.starting(rank))

    def _grant_leaves(self) -> None:
        """Let go the workers that asked to leave (SIGTERM to one worker, or ``sync.leave()``): once its ask is
        ``LEAVE_GRACE_S`` old and no stop came meanwhile (a scheduler's SIGTERM to the whole job reaches the
        launcher too, and is a stop), the launcher marks it gone; the others route around it as around a death,
        and it ends its run without the final average. The last member is not let go: it stops the job."""
        if self._ending():
            self.members.pending.clear()  # the job is ending: those asking finish with it
            return
        for rank, incarnation in self.members.ripe():
            if self.channels.incarnations[rank] != incarnation or self.channels.dead[rank] or rank in self.done:
                continue
            if self.members.count(self.channels.dead) <= 1:
                self._say(f"worker {rank} asked to leave; it is the last member: the job stops")
                self.channels.stop.set()  # as a budget's end: every worker finishes, and the job exits 0
                return
            self.channels.dead[rank] = 1  # first: it and the others see it gone
            self.members.let_go(rank, incarnation, self._training_time_s(), self.progress.get(rank, {}))
            self._say(f"worker {rank} leaves the job ({self.members.count(self.channels.dead)} members)")
            if self.on_death is not None:  # e.g. the Group Generator stops grouping it
                self.on_death(rank)

    def _say(self, line: str) -> None:
        if self.on_members is not None:
            self.on_members(line)

    def _ending(self) -> bool:
        return self.channels.closing.is_set() or self.channels.stop.is_set()

    def _respawn(self, rank: int) -> None:
        """Start a replacement for ``rank``; it stays dead to the others until it announces it joined."""
        self._start_member(rank, self.deaths.last_iteration(rank))

    def _close_membership(self) -> None:
        """A worker is finishing: no replacement joins from now on (the final average needs one
        agreed set of members); replacements still joining are stopped, and so are those admitted that
        hold no model yet: their neighbours, finishing, may never send them one (a neighbour that
        looked before the admission finishes without it), and the final average would wait for them
        (docs/decisions/replacement-admitted-as-the-job-ends.md)."""
        if self.channels.closing.is_set():
            return
        self.channels.closing.set()
        for rank in list(self.replacements.joining):
            if self.workers.alive(rank):
                self.replacements.stopped_pids.add(self.workers.pid(rank))  # not a failure: the job ends without it
                self.workers.kill(rank)
        for rank, incarnation in list(self.replacements.unsettled.items()):
            if self.workers.alive(rank) and self.channels.incarnations[rank] == incarnation:
                self.channels.dead[rank] = 1  # first: the finishing workers stop counting it as a member
                self.replacements.stopped_unsettled(rank, incarnation)
                self.replacements.stopped_pids.add(self.workers.pid(rank))
                self.workers.kill(rank)
                if self.on_death is not None:  # e.g. the Group Generator stops waiting for it to leave
                    self.on_death(rank)

    def _joined(self, rank: int, incarnation: int) -> None:
        awaited = self.replacements.joining.get(rank, {}).get("incarnation")
        if awaited != incarnation or self.channels.incarnations[rank] != incarnation or self.channels.closing.is_set():
            self.replacements.forget(rank)  # a replacement that has since died, or came too late
            return
        if not self._may_admit():
            self.replacements.deferred.append((rank, incarnation))
            return
        self._admit(rank, incarnation)

    def _may_admit(self) -> bool:
        """Whether a ready replacement may join now: one at a time (docs/decisions/replacements-admitted-one-at-a-time.md), and only once the start gate is open, i.e. every original is ready (its
        protocol built: at the start barrier or its first step) or dead. An original still in its handshake
        would wait for the replacement's, which a replacement never sends (docs/decisions/replacement-admitted-during-start-up.md)."""
        return not self.replacements.admitting() and start_gate.admits_replacements(self.channels.go)

    def _admit(self, rank: int, incarnation: int) -> None:
        if self.on_join is not None:  # first (e.g. the Group Generator re-admits it), then the others see it
            self.on_join(rank, incarnation)
        self.channels.dead[rank] = 0  # alive again: the survivors connect to its new incarnation
        if self.replacements.joining.get(rank, {}).get("new_member"):
            self._say(f"worker {rank} joined ({self.members.count(self.channels.dead)} workers)")
        self.replacements.join(rank, incarnation, self._training_time_s(), wall_s=time.monotonic() - self.launched)

    def _admit_deferred(self) -> None:
        """Admit the next replacement that is ready once every admitted one holds the job's model: two
        neighbours admitted together each waited for the other's model, which neither had (Hop: "worker
        0 (a replacement) waited 60 s for a model from its in-neighbours [1, 5]", three ranks of a ring
        lost with one node)."""
        while self.replacements.deferred and self._may_admit() and not self.channels.closing.is_set():
            rank, incarnation = self.replacements.deferred.pop(0)
            if (self.replacements.joining.get(rank, {}).get("incarnation") == incarnation
                    and self.channels.incarnations[rank] == incarnation and self.workers.alive(rank)):
                self._admit(rank, incarnation)

    def _note_recoveries(self) -> None:
        self.deaths.note_recoveries(self.progress, lambda r: self.channels.dead[r])

    def _dead_without_result(self, grace_s: float = _RESULT_GRACE_S) -> list[int]:
        """Ranks whose process ended without a result: by a signal or an exit code, or with code 0 and no
        result for ``_RESULT_GRACE_S`` (a result is put just before a clean exit; the launcher waited for ever
        on a job function that called ``os._exit(0)``)."""
        dead = []
        for rank in range(self.n):
            code = self.workers.exitcode(rank)
            if code is None or rank in self.done or rank in self.failures or rank in self.members.vacant:
                continue
            if code == 0:
                seen = self._quiet_exits.setdefault(self.workers.pid(rank), time.monotonic())
                if time.monotonic() - seen < grace_s:
                    continue
            dead.append(rank)
        return dead

    def _missing(self) -> list[int]:
        return sorted(set(range(self.n)) - self._ended())

    def _ended(self) -> set[int]:
        """Ranks with no process to wait for: finished, gone, or vacant (a rank whose worker left is
        finished and vacant at once)."""
        return set(self.done) | self.gone | set(self.members.vacant)

    # -- failure -----------------------------------------------------------------------
    def _fail(self) -> None:
        """Listen a little longer (who died, who only lost a peer), then raise one line naming the cause."""
        grace_end = time.monotonic() + _FAILURE_GRACE_S
        while time.monotonic() < grace_end:
            self._collect(_POLL_S)
            self._drain_messages()
            if self.workers.exited(r for r in range(self.n) if r not in self.done):
                break
        for rank in self._dead_without_result():  # an error report may still be in the queue just behind the death
            self._collect(0.2 if self.workers.exitcode(rank) > 0 else 0.0)
        # after the grace every result sent is in: a clean exit without one is a cause, not a bystander
        dead = {rank: self._how(rank)[0] for rank in self._dead_without_result(grace_s=0.0)}
        if self.log_path and not write_log(self.log_path, dead, self.failures):
            self.log_path = None
        raise failure_error(dead, self.failures, self.log_path)
