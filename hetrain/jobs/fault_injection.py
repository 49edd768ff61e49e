"""Faults injected for real (``--fail``): SIGKILL or SIGSTOP of given ranks on the training clock,
the wall clock, or as they enter a phase (:class:`hetrain.faults.Fault`)."""

from __future__ import annotations

from hetrain.faults import Fault


class FaultSchedule:
    """The faults still to fire; ``due`` hands out those whose moment has come, each once."""

    def __init__(self, faults: list[Fault]):
        self.pending = list(faults)
        self.injected: dict[int, Fault] = {}  # pid -> the fault sent to it (its death or hang says so)

    def due(self, training_time_s: float | None, wall_s: float, phases: dict[int, set[str]]) -> list[Fault]:
        """``training_time_s``: the job's training clock (None before any worker trains); ``wall_s``: since
        the launch; ``phases``: the phases each rank's current process has entered."""
        fired = [f for f in self.pending if
                 (f.clock == "train" and training_time_s is not None and training_time_s >= f.at_s)
                 or (f.clock == "wall" and wall_s >= f.at_s)
                 or (f.clock == "phase" and f.phase in phases.get(f.worker, ()))]
        self.pending = [f for f in self.pending if f not in fired]
        return fired
