"""Hung workers: each worker's heartbeat, and the launcher's watch for those that fall silent.

A worker can hang without dying: a stuck driver, a host swapped out, SIGSTOP. Its neighbours
would wait for it until ``--timeout`` and then fail the job. Every worker of a local job runs a
thread that reports to the launcher every ``HEARTBEAT_INTERVAL_S``; any message counts. The
launcher declares a worker silent for ``--heartbeat-timeout`` seconds (default 30; 0: off) hung,
SIGKILLs it and handles it as any death (``deaths[].cause: "hung"``): the job goes on under
``continue``/``respawn`` and fails naming it under ``abort``. The heartbeat comes from a thread,
so a worker whose main thread is merely waiting (for a slow neighbour) is not hung; one whose
process is stopped is. A main thread stuck while the process runs is left to the protocols'
``--timeout``.
"""

from __future__ import annotations

import threading
import time

HEARTBEAT_INTERVAL_S = 1.0
DEFAULT_HEARTBEAT_TIMEOUT_S = 30.0


def start_heartbeat(send) -> threading.Thread:
    """Worker side: call ``send()`` every ``HEARTBEAT_INTERVAL_S`` on a daemon thread, for the process's life."""
    def beat() -> None:
        while True:
            try:
                send()
            except (ValueError, OSError):  # the worker is exiting: its queue to the launcher is closed
                return
            time.sleep(HEARTBEAT_INTERVAL_S)

    thread = threading.Thread(target=beat, name="hetrain-heartbeat", daemon=True)
    thread.start()
    return thread


class SilenceWatch:
    """Launcher side: when each rank's current process was last heard from."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.last_heard: dict[int, float] = {}
        self.beating: set[int] = set()  # ranks whose current process has sent a message since it started

    def started(self, rank: int) -> None:
        self.last_heard[rank] = time.monotonic()
        self.beating.discard(rank)

    def heard(self, rank: int) -> None:
        self.started(rank)
        self.beating.add(rank)

    def silent(self, ranks) -> dict[int, float]:
        """The ranks among ``ranks`` silent for longer than the timeout, with their seconds of silence."""
        if self.timeout_s <= 0:
            return {}
        now = time.monotonic()
        return {r: now - self.last_heard[r] for r in ranks
                if r in self.last_heard and now - self.last_heard[r] > self.timeout_s}
