"""Transient slowdowns, measured and simulated: a worker's iterations that now and then take far longer.

The measuring run's ledger (``compute_phase``) counts each worker's *spikes*: iterations whose compute
phase is twice its median or more (``spike_share``) and how long they are on average (``spike_to_median``).
A worker that spikes is simulated at its steady speed (its measured mean with the spikes taken out) and, at
each iteration, ``spike_to_median`` times slower with probability ``spike_share``: a slowdown trace drawn
from the measured distribution (the simulator's ``trace:FILE`` spec). Without it a cluster of random
stragglers would be simulated as equal workers at their mean speed, and all-reduce, which waits for the
slowest worker at every step, would look as fast as it is at the mean.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

from hetrain.errors import UsageError

TRACE_MARGIN = 1.25  # iterations drawn beyond what the fastest worker can compute in the simulated time


def spikes_of(worker: dict) -> dict | None:
    """``{"share": P, "factor": K}`` from a worker's record (None: no transient slowdown was seen)."""
    phase = worker.get("compute_phase") or {}
    share, factor = phase.get("spike_share"), phase.get("spike_to_median")
    if not share or not factor or factor <= 1.0:
        return None
    return {"share": share, "factor": factor}


def steady_compute_ms(profile: dict) -> list[float]:
    """Each worker's compute time per iteration with its spikes (and its first, warm-up iteration) taken
    out: the ledger's ``steady_ms_mean`` where measured, else the mean over the spikes' expected factor,
    ``1 + P (K - 1)``."""
    n = len(profile["compute_ms"])
    spikes = profile.get("spikes") or [None] * n
    measured = profile.get("steady_compute_ms") or [None] * n
    return [m if m else (c / (1.0 + s["share"] * (s["factor"] - 1.0)) if s else c)
            for c, s, m in zip(profile["compute_ms"], spikes, measured)]


def has_spikes(profile: dict) -> bool:
    return any(profile.get("spikes") or [])


def simulated_slowdown(profile: dict, directory: str | Path, horizon_s: float, seed: int) -> tuple[float, str]:
    """(the fastest worker's steady compute ms, the slowdown spec) that the simulator runs the profile with:
    fixed factors when no worker spikes, else a trace written under ``directory`` covering ``horizon_s``
    simulated seconds of the fastest worker, each worker's spikes drawn at its measured share and size."""
    steady = steady_compute_ms(profile)
    fastest = min(steady)
    if fastest <= 0:
        raise UsageError("the measured compute time per iteration is 0; give --compute-ms > 0 to advise on it")
    factors = [c / fastest for c in steady]
    if not has_spikes(profile):
        spec = ",".join(f"{i}:{f:.3f}x" for i, f in enumerate(factors) if f >= 1.0005)
        return fastest, spec or "none"
    iterations = int(TRACE_MARGIN * horizon_s * 1000.0 / fastest) + 10
    draw = random.Random(seed)
    path = Path(directory) / "measured_slowdown.csv"
    with open(path, "w", newline="") as handle:
        rows = csv.writer(handle)
        rows.writerow(["worker", "iteration", "factor"])
        for worker, (base, spike) in enumerate(zip(factors, profile["spikes"])):
            for iteration in range(iterations):
                factor = base * (spike["factor"] if spike and draw.random() < spike["share"] else 1.0)
                if factor >= 1.0005:
                    rows.writerow([worker, iteration, f"{factor:.3f}"])
    return fastest, f"trace:{path}"
