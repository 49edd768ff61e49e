"""The worker processes of one local job: start, look at, kill and reap them, by rank."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

from hetrain.jobs import mailboxes
from hetrain.jobs.mailboxes import MergedQueue
from hetrain.jobs.warm_start import start_early, worker_context
from hetrain.jobs.worker_process import JobChannels, WorkerSpec, worker_main


class WorkerProcesses:
    """One process per rank (the current incarnation), started from ``template`` with the job's channels."""

    def __init__(self, template: WorkerSpec):
        start_early()  # a no-op once the warm server runs
        self.context = worker_context()
        self.template = template
        shared = JobChannels.create(self.context, template.world_size)
        self.mailboxes: list[JobChannels] = []  # each process's channels, with queues of its own
        self.channels = dataclasses.replace(shared, results=MergedQueue("results", self.mailboxes),
                                            messages=MergedQueue("messages", self.mailboxes))
        self._shared = shared
        self.procs: list = [None] * template.world_size

    @property
    def size(self) -> int:
        return self.template.world_size

    def start(self, rank: int, incarnation: int = 0, clock_offset_s: float = 0.0, start_iteration: int = 0,
              hold_phases: tuple = ()) -> None:
        """Start ``rank``'s process (a replacement when ``incarnation`` > 0), with the launcher's environment now."""
        spec = dataclasses.replace(self.template, rank=rank, incarnation=incarnation, clock_offset_s=clock_offset_s,
                                   start_iteration=start_iteration, env=dict(os.environ), launched_at=time.time(),
                                   hold_phases=tuple(hold_phases))
        results, messages = mailboxes.own_queues(self.context)
        own = dataclasses.replace(self._shared, results=results, messages=messages)
        self.mailboxes.append(own)  # hetrain.jobs.mailboxes: a writer killed mid-message stops its own only
        proc = self.context.Process(target=worker_main, args=(spec, own), name=spec.name, daemon=True)
        proc.start()
        self.procs[rank] = proc

    def pid(self, rank: int) -> int | None:
        return None if self.procs[rank] is None else self.procs[rank].pid

    def exitcode(self, rank: int) -> int | None:
        """None while it runs, and for a rank never started (a vacant rank of a job that may grow)."""
        return None if self.procs[rank] is None else self.procs[rank].exitcode

    def alive(self, rank: int) -> bool:
        return self.procs[rank] is not None and self.procs[rank].is_alive()

    def kill(self, rank: int) -> None:
        os.kill(self.procs[rank].pid, signal.SIGKILL)

    def signal(self, rank: int, signum: int) -> None:
        os.kill(self.procs[rank].pid, signum)

    def exited(self, ranks) -> bool:
        return all(self.procs[r] is None or self.procs[r].exitcode is not None for r in ranks)

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            if proc is not None and proc.pid is not None:
                proc.join(timeout=max(0.0, deadline - time.monotonic()))

    def kill_all(self) -> None:
        """Kill what still runs and reap everything (the job is over, one way or another)."""
        for proc in self.procs:
            if proc is not None and proc.is_alive():
                proc.kill()
        for proc in self.procs:
            if proc is not None and proc.pid is not None:
                proc.join(timeout=5)
