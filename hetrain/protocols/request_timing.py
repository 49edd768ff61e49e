"""When to ask the Group Generator: shortly before the compute is expected to end (pure; no torch).

Shared by the runtime (:mod:`hetrain.groups.gg_prefetch`, which sends the
request from a helper thread) and the simulator (:mod:`hetrain.sim.prague_sim`),
so both hide the same round trip the same way.
"""

from __future__ import annotations

_EMA = 0.2  # weight of the newest compute time in the estimate


class ComputeEstimate:
    """Exponential average of a worker's compute times (seconds); None until the first."""

    def __init__(self) -> None:
        self.value: float | None = None

    def add(self, seconds: float) -> None:
        self.value = seconds if self.value is None else (1 - _EMA) * self.value + _EMA * seconds


def ask_after_s(estimate_s: float, lead_ms: float) -> float:
    """Seconds after the compute starts to send the request: ``lead_ms`` before the expected end,
    at most half the compute early."""
    return estimate_s - min(lead_ms / 1e3, estimate_s / 2)
