"""Run a function on N local worker processes that form one torch.distributed job.

Used by ``hetrain train`` and by the tests. Rendezvous goes through a
``FileStore`` in a fresh temporary directory (no ports to pick). The parent
watches the children:

- the first failure (an error a worker reports, or a worker that dies) kills
  every rank and raises :class:`WorkerError` with one line naming the worker
  that failed first and how (``worker 1 was killed by SIGKILL ...``), not a
  survivor's complaint about the connection it lost; every worker's full
  traceback goes to ``log_path`` when one is given;
- workers die with the parent (:mod:`hetrain.runtime.process_guard`), so a
  killed launcher leaves no orphans;
- Ctrl-C (SIGINT) asks the workers to stop at their next iteration
  (``ctx.stop_requested()``) and returns what they have, marked
  ``interrupted``; a second Ctrl-C kills them;
- with ``on_failure="continue"`` a worker that *dies* (exits without a
  result) does not end the job: the launcher records the death, publishes it
  to the survivors through shared memory (``ctx.dead_workers()``; protocols
  repair around it) and waits for the others. A worker that *reports an
  error* still fails the job. ``kills`` injects deaths for real (SIGKILL at a
  given training time, from the workers' progress reports);
- with ``on_failure="respawn"`` a death is handled as with ``continue`` and a
  replacement process starts for the same rank, one *incarnation* later. It
  builds its protocol, which announces ``{"joined": incarnation}``; only then
  does the launcher mark the rank alive again (``ctx.membership``), so the
  survivors connect to it and hand it the model (docs/decisions.md,
  "Respawn"). No replacement starts once a worker has finished or Ctrl-C
  was pressed: the job is ending.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from hetrain.errors import HetrainError, UsageError, WorkerError
from hetrain.runtime.process_guard import describe_exit, die_with_parent

_POLL_S = 0.05
_FAILURE_GRACE_S = 1.5  # after a first failure: time to hear from the rest (who died, who merely lost a peer)


class JobResults(list):
    """Results by rank (None for a worker that died); ``interrupted`` when Ctrl-C stopped the job early;
    ``joins``: each replacement that joined (rank, incarnation, training time);
    ``deaths``: one dict per worker lost (rank, how, training time, recovery time of the survivors);
    ``last_progress``: each worker's last progress report."""

    interrupted: bool = False
    deaths: list = []
    joins: list = []
    last_progress: dict = {}


def _child(fn, rank, world_size, store_path, backend, timeout_s, args, results, messages, parent_pid, stop,
           dead, incarnations, closing, on_failure, incarnation, clock_offset_s, start_iteration):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))  # one node, as torchrun says it
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher handles Ctrl-C and asks us to stop
    try:
        import torch
        import torch.distributed as dist

        from hetrain.runtime.context import LauncherMembership, WorkerContext
        from hetrain.runtime.job import prefer_lazy_connections

        torch.set_num_threads(1)
        prefer_lazy_connections()
        store = dist.FileStore(store_path, world_size)
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            device = torch.device("cuda", rank % torch.cuda.device_count())
        else:
            device = torch.device("cpu")
        report = lambda message: messages.put((rank, message))  # noqa: E731
        membership = None if on_failure == "abort" else LauncherMembership(
            dead, incarnations, rank, incarnation, report, closing.wait)
        ctx = WorkerContext(rank, world_size, device, timeout_s, report=report, stop_requested=stop.is_set,
                            dead_workers=membership, continue_on_death=on_failure != "abort",
                            on_failure=on_failure, incarnation=incarnation, clock_offset_s=clock_offset_s,
                            start_iteration=start_iteration)
        result = fn(ctx, *args)
        results.put((rank, "ok", result, None))
        if on_failure == "abort":
            dist.barrier()  # nobody leaves while another rank may still talk to it (a dead rank never would)
    except BaseException as exc:  # report every failure to the parent, then die
        kind = "usage" if isinstance(exc, UsageError) else "error"
        detail = traceback.format_exc()
        summary = str(exc) if isinstance(exc, HetrainError) else _last_line(detail)
        results.put((rank, kind, summary, detail))
        _exit_now(1, results, messages)
    _exit_now(0, results, messages)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "unknown error"


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
    log_path: str | os.PathLike | None = None,
    on_failure: str = "abort",
    kills: list[tuple[float, int]] | None = None,
    on_death: Callable[[int], None] | None = None,
    on_join: Callable[[int, int], None] | None = None,
) -> JobResults:
    """Run ``fn(ctx, *args)`` on ``num_workers`` processes; return their results by rank.

    ``ctx`` is a :class:`hetrain.runtime.context.WorkerContext` with a
    ``report(message)`` method that sends a picklable message to the parent,
    where ``on_message(rank, message)`` receives it (e.g. for a progress bar),
    and ``stop_requested()``, which turns True after Ctrl-C.
    ``timeout_s`` bounds each blocking wait inside the job; ``job_timeout_s``
    bounds the whole job (default: no bound beyond the per-wait timeouts).
    ``log_path``: where a failed job writes every worker's full traceback.
    ``on_failure``: ``abort`` (a death fails the job), ``continue`` or ``respawn`` (see the
    module docstring); ``kills``: ``(training_time_s, rank)`` pairs to SIGKILL; ``on_death(rank)``
    runs in the launcher when a worker is found dead (e.g. to tell a Group Generator),
    ``on_join(rank, incarnation)`` when its replacement has joined.
    """
    return _LocalJob(fn, num_workers, args, backend, timeout_s, job_timeout_s, on_message, log_path,
                     on_failure, kills or [], on_death, on_join).run()


class _LocalJob:
    def __init__(self, fn, num_workers, args, backend, timeout_s, job_timeout_s, on_message, log_path,
                 on_failure, kills, on_death, on_join):
        if on_failure not in ("abort", "continue", "respawn"):
            raise ValueError(f"on_failure must be abort, continue or respawn, got {on_failure!r}")
        self.on_failure = on_failure
        self.continue_on_death = on_failure != "abort"
        self.kills = sorted(kills)
        self.on_death = on_death
        self.on_join = on_join
        self.n = num_workers
        self.fn, self.args, self.backend = fn, args, backend
        self.timeout_s = timeout_s
        self.job_timeout_s = job_timeout_s
        self.on_message = on_message
        self.log_path = log_path
        self.mp = mp.get_context("spawn")
        self.results, self.messages = self.mp.Queue(), self.mp.Queue()
        self.stop = self.mp.Event()
        self.closing = self.mp.Event()  # a worker is finishing: membership is frozen (no more joins)
        self.dead = self.mp.Array("b", num_workers, lock=False)  # the survivors read who died (no lock: bytes)
        self.incarnations = self.mp.Array("i", num_workers, lock=False)  # bumped when a replacement starts
        self.tmp = tempfile.mkdtemp(prefix="hetrain-job-")
        self.store_path = os.path.join(self.tmp, "store")
        self.procs = [self._process(rank, 0, 0.0) for rank in range(num_workers)]
        self.done: dict[int, Any] = {}
        self.failures: dict[int, tuple[str, str, str | None]] = {}  # rank -> (kind, summary, detail)
        self.interrupts = 0
        self.stop_deadline: float | None = None
        self.deaths: list[dict] = []  # what we know of each death, in order
        self.gone: set[int] = set()  # ranks dead for good (no replacement)
        self.joining: dict[int, dict] = {}  # rank -> its replacement's record until it joins
        self.joins: list[dict] = []
        self.injected: set[int] = set()  # pids killed by ``kills``
        self.not_admitted: set[int] = set()  # replacements stopped because the job was ending
        self.started_t_s: dict[int, float] = {}  # rank -> training time its current process started
        self.progress: dict[int, dict] = {}  # rank -> its last progress report (with "at": launcher clock)

    def _process(self, rank: int, incarnation: int, clock_offset_s: float, start_iteration: int = 0):
        return self.mp.Process(
            target=_child, name=f"hetrain-worker-{rank}" + (f"-{incarnation}" if incarnation else ""),
            args=(self.fn, rank, self.n, self.store_path, self.backend, self.timeout_s, self.args, self.results,
                  self.messages, os.getpid(), self.stop, self.dead, self.incarnations, self.closing,
                  self.on_failure, incarnation, clock_offset_s, start_iteration),
            daemon=True,
        )

    # -- the watch loop ------------------------------------------------------------
    def run(self) -> JobResults:
        deadline = None if self.job_timeout_s is None else time.monotonic() + self.job_timeout_s
        previous = self._install_interrupt_handler()
        try:
            for proc in self.procs:
                proc.start()
            while len(self.done) + len(self.gone) < self.n:
                self._drain_messages()
                self._collect(_POLL_S)
                self._inject_kills()
                dead = [r for r in self._dead_without_result() if not self._known_dead(r)]
                if self.continue_on_death and dead and not self.failures:
                    self._record_deaths(dead)
                elif self.failures or dead:
                    self._fail()
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    raise WorkerError(f"job did not finish within {self.job_timeout_s:.0f} s; still running: "
                                      f"workers {self._missing()}")
                if self.stop_deadline is not None and now > self.stop_deadline:
                    raise WorkerError(f"interrupted: workers {self._missing()} did not stop within "
                                      f"{self.timeout_s:.0f} s of Ctrl-C")
            self._drain_messages()
            for proc in self.procs:
                proc.join(timeout=self.timeout_s)
            if len(self.gone) == self.n:
                last = [d for d in self.deaths if "how" in d][-1]
                raise WorkerError(f"every worker died; the last, worker {last['rank']}, {last['how']}")
            results = JobResults(self.done.get(rank) for rank in range(self.n))
            results.interrupted = self.interrupts > 0
            results.deaths = [{k: v for k, v in d.items() if not k.startswith("_")} for d in self.deaths
                              if not d.get("_not_admitted")]
            results.joins = list(self.joins)
            results.last_progress = dict(self.progress)
            return results
        finally:
            self._restore_interrupt_handler(previous)
            for proc in self.procs:
                if proc.is_alive():
                    proc.kill()
            for proc in self.procs:
                if proc.pid is not None:
                    proc.join(timeout=5)
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _collect(self, wait_s: float) -> None:
        try:
            rank, kind, value, detail = self.results.get(timeout=wait_s)
        except queue.Empty:
            return
        if kind == "ok":
            self.done[rank] = value
        else:
            self.failures.setdefault(rank, (kind, value, detail))

    def _drain_messages(self) -> None:
        while True:
            try:
                rank, message = self.messages.get_nowait()
            except queue.Empty:
                return
            if isinstance(message, dict) and "joined" in message:
                self._joined(rank, message["joined"])
                continue
            if isinstance(message, dict) and "finishing" in message:
                self._close_membership()
                continue
            if isinstance(message, dict):
                self.progress[rank] = dict(message, at=time.monotonic())
                self._note_recoveries()
            if self.on_message is not None:
                self.on_message(rank, message)

    # -- deaths (continue and respawn), replacements and injected kills -----------------------------
    def _training_time_s(self) -> float:
        return max((p.get("t_s", 0.0) for p in self.progress.values()), default=0.0)

    def _inject_kills(self) -> None:
        while self.kills and self.progress and self._training_time_s() >= self.kills[0][0]:
            _, rank = self.kills.pop(0)
            proc = self.procs[rank]
            if rank not in self.done and proc.is_alive():
                self.injected.add(proc.pid)
                os.kill(proc.pid, signal.SIGKILL)

    def _known_dead(self, rank: int) -> bool:
        """Whether the death of ``rank``'s current process is already recorded."""
        return any(d["rank"] == rank and d["incarnation"] == self.incarnations[rank] for d in self.deaths)

    def _record_deaths(self, ranks: list[int]) -> None:
        now = time.monotonic()
        for rank in ranks:
            if self.procs[rank].pid in self.not_admitted:
                self.joining.pop(rank, None)
                self.gone.add(rank)
                self.deaths.append({"rank": rank, "incarnation": self.incarnations[rank], "_not_admitted": True})
                continue
            self.dead[rank] = 1  # the survivors see it at their next check
            self.joining.pop(rank, None)  # a replacement that died before joining
            alive = [r for r in range(self.n) if r != rank and r not in self.done and not self.dead[r]]
            survivors = {r: self.progress.get(r, {}).get("computed", 0) for r in alive}
            injected = self.procs[rank].pid in self.injected
            self.deaths.append({"rank": rank, "incarnation": self.incarnations[rank],
                                "how": "was killed by --fail (SIGKILL)" if injected
                                else describe_exit(self.procs[rank].exitcode),
                                "started_t_s": self.started_t_s.get(rank, 0.0),
                                "iteration": self.progress.get(rank, {}).get("iteration", 0),
                                "t_s": self._training_time_s(), "wall_s": now,
                                "computed": self.progress.get(rank, {}).get("computed", 0),
                                "recovery_s": None, "_awaiting": survivors})
            self.progress.pop(rank, None)
            if self.on_death is not None:
                self.on_death(rank)
            if self.on_failure == "respawn" and not self.closing.is_set() and not self.stop.is_set() and alive:
                self._respawn(rank)
            else:
                self.gone.add(rank)
        self._note_recoveries()

    def _respawn(self, rank: int) -> None:
        """Start a replacement for ``rank``; it stays dead to the others until it announces it joined."""
        incarnation = self.incarnations[rank] + 1
        self.incarnations[rank] = incarnation
        t_s = self._training_time_s()
        self.started_t_s[rank] = t_s
        inherited = max((d.get("iteration", 0) for d in self.deaths if d["rank"] == rank), default=0)
        self.procs[rank] = self._process(rank, incarnation, t_s, inherited)
        self.procs[rank].start()
        self.joining[rank] = {"rank": rank, "incarnation": incarnation, "started_t_s": t_s,
                              "_started": time.monotonic()}

    def _close_membership(self) -> None:
        """A worker is finishing: no replacement joins from now on (the final average needs one
        agreed set of members); replacements still joining are stopped."""
        if self.closing.is_set():
            return
        self.closing.set()
        for rank in list(self.joining):
            proc = self.procs[rank]
            if proc.is_alive():
                self.not_admitted.add(proc.pid)  # not a failure: the job ends without it
                os.kill(proc.pid, signal.SIGKILL)

    def _joined(self, rank: int, incarnation: int) -> None:
        record = self.joining.pop(rank, None)
        if record is None or record["incarnation"] != incarnation or self.incarnations[rank] != incarnation:
            return  # a replacement that has since died
        if self.closing.is_set():
            return  # too late: it is being stopped
        if self.on_join is not None:  # first (e.g. the Group Generator re-admits it), then the others see it
            self.on_join(rank, incarnation)
        self.dead[rank] = 0  # alive again: the survivors connect to its new incarnation
        record.update(joined_t_s=self._training_time_s(), join_s=time.monotonic() - record.pop("_started"))
        self.joins.append(record)

    def _note_recoveries(self) -> None:
        """A death's recovery ends when every survivor has computed again (from progress reports)."""
        for event in self.deaths:
            awaiting = event.get("_awaiting")  # (none for a replacement that was not admitted)
            if not awaiting:
                continue
            for rank in list(awaiting):
                report = self.progress.get(rank, {})
                if self.dead[rank] or report.get("done") or report.get("computed", 0) > awaiting[rank]:
                    del awaiting[rank]
            if not awaiting:
                event["recovery_s"] = time.monotonic() - event["wall_s"]
                event.pop("_awaiting")

    def _dead_without_result(self) -> list[int]:
        return [rank for rank, proc in enumerate(self.procs)
                if proc.exitcode not in (None, 0) and rank not in self.done and rank not in self.failures]

    def _missing(self) -> list[int]:
        return sorted(set(range(self.n)) - set(self.done))

    # -- failure -----------------------------------------------------------------------
    def _fail(self) -> None:
        """Listen a little longer (who died, who only lost a peer), then raise one line naming the cause."""
        grace_end = time.monotonic() + _FAILURE_GRACE_S
        while time.monotonic() < grace_end:
            self._collect(_POLL_S)
            self._drain_messages()
            if all(p.exitcode is not None for r, p in enumerate(self.procs) if r not in self.done):
                break
        dead = self._dead_without_result()
        for rank in dead:  # an error report may still be in the queue just behind the death
            self._collect(0.2 if self.procs[rank].exitcode > 0 else 0.0)
        dead = self._dead_without_result()
        self._write_log(dead)
        see_log = f" (tracebacks: {self.log_path})" if self.log_path and self.failures else ""
        usage = [r for r, (kind, _, _) in self.failures.items() if kind == "usage"]
        if usage:
            raise UsageError(self.failures[usage[0]][1])
        if dead:
            first = dead[0]
            others = [r for r in self.failures if r != first]
            after = f"; then worker {others[0]} failed: {_first_line(self.failures[others[0]][1])}" if others else ""
            raise WorkerError(f"worker {first} {describe_exit(self.procs[first].exitcode)}{after}{see_log}")
        rank = next(iter(self.failures))
        raise WorkerError(f"worker {rank} failed: {_first_line(self.failures[rank][1])}{see_log}")

    def _write_log(self, dead: list[int]) -> None:
        if not self.log_path:
            return
        lines = [f"hetrain job failed at {time.strftime('%Y-%m-%d %H:%M:%S')}"]
        for rank in dead:
            lines.append(f"\n== worker {rank} {describe_exit(self.procs[rank].exitcode)} (no report)")
        for rank, (_, summary, detail) in self.failures.items():
            lines.append(f"\n== worker {rank} failed: {summary}\n{detail or ''}")
        try:
            with open(self.log_path, "w") as handle:
                handle.write("\n".join(lines) + "\n")
        except OSError:
            self.log_path = None

    # -- Ctrl-C -----------------------------------------------------------------------
    def _install_interrupt_handler(self):
        if threading.current_thread() is not threading.main_thread():
            return None
        return signal.signal(signal.SIGINT, self._on_interrupt)

    def _restore_interrupt_handler(self, previous) -> None:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)

    def _on_interrupt(self, signum, frame) -> None:
        self.interrupts += 1
        if self.interrupts > 1:
            raise KeyboardInterrupt
        self.stop.set()
        self.stop_deadline = time.monotonic() + self.timeout_s
        print("\nhetrain: stopping the workers at their next iteration (Ctrl-C again to kill them)",
              file=sys.stderr, flush=True)


def _first_line(text: str) -> str:
    text = (text or "").strip()
    return text.splitlines()[0] if text else "unknown error"
