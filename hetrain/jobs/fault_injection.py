"""Deaths injected for real: SIGKILL of given ranks at given training times (``--fail``)."""

from __future__ import annotations


class KillSchedule:
    """``(training_time_s, rank)`` pairs, handed out in time order as the job's training clock passes them."""

    def __init__(self, kills: list[tuple[float, int]]):
        self.pending = sorted(kills)
        self.killed_pids: set[int] = set()  # processes killed by this schedule (their deaths say so)

    def due(self, training_time_s: float) -> list[int]:
        ranks = []
        while self.pending and training_time_s >= self.pending[0][0]:
            ranks.append(self.pending.pop(0)[1])
        return ranks
