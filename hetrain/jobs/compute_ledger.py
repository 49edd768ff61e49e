"""Each iteration's compute phase against its target: what the record says of a worker's emulation.

An emulated worker (``--compute-ms``) should compute for its target every iteration. Whether it did
is measured, not assumed: :class:`ComputeLedger` keeps every iteration's target, achieved phase
(work + sleep) and real work (what the sleep completed), and :meth:`ComputeLedger.summary` gives the
worker's ``compute_phase`` in ``metrics.json``. A worker whose real work is longer than its target
in at least :data:`OVER_TARGET_SHARE` of its iterations (and :data:`OVER_TARGET_MIN` of them) is
``over_target``: its speed is the machine's, not the emulation's, and the launcher names it
(:func:`over_target_warning`).
"""

from __future__ import annotations

import statistics
from array import array

OVER_TARGET_SHARE = 0.1  # of a worker's iterations whose work outlasted the target: sustained, not a hiccup
OVER_TARGET_MIN = 5  # iterations at least (a 10-iteration run's one slow start is no pattern)
SPIKE_RATIO = 2.0  # an iteration whose phase is this many times the worker's median or more: a transient slowdown
# iterations left out of the spike count: the start's (under all-reduce behind a 5x worker, every fast worker's
# second phase measured 200-225 ms on 50 ms, once, in every run: a start-up effect, no recurring slowdown)
WARM_UP_ITERATIONS = 2


class ComputeLedger:
    """Per iteration: target, achieved phase and real work, in seconds (float32 each: 12 bytes an iteration)."""

    def __init__(self):
        self.target_s = array("f")
        self.achieved_s = array("f")
        self.work_s = array("f")

    def record(self, target_s: float, achieved_s: float, work_s: float) -> None:
        self.target_s.append(target_s)
        self.achieved_s.append(achieved_s)
        self.work_s.append(work_s)

    @property
    def iterations(self) -> int:
        return len(self.target_s)

    def mean_achieved_s(self) -> float | None:
        """Seconds of compute phase per iteration, on average after the first :data:`WARM_UP_ITERATIONS`
        (all of them in a shorter run; None before the first iteration). Under DDP a fast worker's second
        phase holds a collective: the second forward broadcasts the rebuilt gradient buckets, waiting for
        the slowest worker (200-225 ms on 50 ms behind a 5x worker), which read as compute raised the
        worker's own speed's basis by a quarter in a 3 s run (efficiency 0.30 where 0.25 is exact)."""
        if not self.iterations:
            return None
        later = self.achieved_s[WARM_UP_ITERATIONS:] if self.iterations > WARM_UP_ITERATIONS else self.achieved_s
        return sum(later) / len(later)

    def median_work_s(self) -> float | None:
        return statistics.median(self.work_s) if self.iterations else None

    def summary(self) -> dict:
        """``target_ms`` (mean), ``achieved_ms_mean``/``_median``, ``work_ms_mean``/``_median``,
        ``achieved_to_target_median``/``_min``, ``share_over_target`` (work > target), ``share_under_85``
        (phase < 0.85 target), ``over_target`` (sustained: see the module); after the first
        :data:`WARM_UP_ITERATIONS` (the start is no slowdown): ``spike_share`` (iterations whose phase is
        :data:`SPIKE_RATIO` x the median or more: transient slowdowns), ``spike_to_median`` (their mean
        phase over the median; None without one) and ``steady_ms_mean`` (the mean phase of the others);
        {"iterations": 0} if none ran."""
        n = self.iterations
        if not n:
            return {"iterations": 0}
        ratios = [a / t if t > 0 else 1.0 for a, t in zip(self.achieved_s, self.target_s)]
        over = sum(w > t for w, t in zip(self.work_s, self.target_s))
        median = statistics.median(self.achieved_s)
        later = self.achieved_s[WARM_UP_ITERATIONS:] if n > WARM_UP_ITERATIONS else self.achieved_s
        spikes = [a for a in later if median > 0 and a >= SPIKE_RATIO * median]
        steady = [a for a in later if not (median > 0 and a >= SPIKE_RATIO * median)]
        ms = 1000.0
        return {
            "iterations": n,
            "target_ms": round(sum(self.target_s) / n * ms, 3),
            "achieved_ms_mean": round(sum(self.achieved_s) / n * ms, 3),
            "achieved_ms_median": round(median * ms, 3),
            "work_ms_mean": round(sum(self.work_s) / n * ms, 3),
            "work_ms_median": round(statistics.median(self.work_s) * ms, 3),
            "achieved_to_target_median": round(statistics.median(ratios), 4),
            "achieved_to_target_min": round(min(ratios), 4),
            "share_over_target": round(over / n, 4),
            "share_under_85": round(sum(r < 0.85 for r in ratios) / n, 4),
            "over_target": over >= OVER_TARGET_MIN and over / n >= OVER_TARGET_SHARE,
            "spike_share": round(len(spikes) / len(later), 4),
            "spike_to_median": round(sum(spikes) / len(spikes) / median, 3) if spikes else None,
            "steady_ms_mean": round(sum(steady) / len(steady) * ms, 3) if steady else None,
        }


def job_compute_phase(workers: list[dict]) -> dict:
    """The record's job-wide fields: ``compute_phase_over_target`` (ranks) and ``compute_phase_ratio_min``
    (the lowest worker median of achieved / target)."""
    phases = [(w.get("rank", i), w["compute_phase"]) for i, w in enumerate(workers)
              if (w.get("compute_phase") or {}).get("iterations")]
    return {"compute_phase_over_target": [rank for rank, p in phases if p["over_target"]],
            "compute_phase_ratio_min": min((p["achieved_to_target_median"] for _, p in phases), default=None)}


def over_target_warning(record: dict) -> str | None:
    """One line naming the workers whose real work outlasted their emulated target (None if none did)."""
    ranks = record.get("compute_phase_over_target") or []
    if not ranks:
        return None
    # a rank's processes (a dead one and its replacement) each have an entry: the one that measured a phase
    by_rank = {w["rank"]: w["compute_phase"] for w in record["workers"]
               if (w.get("compute_phase") or {}).get("iterations")}
    parts = ", ".join(f"worker {r} ({by_rank[r]['share_over_target']:.0%} of {by_rank[r]['iterations']} iterations; "
                      f"work median {by_rank[r]['work_ms_median']:.1f} ms vs target {by_rank[r]['target_ms']:.1f} ms)"
                      for r in ranks)
    return (f"warning: real compute outlasted the emulated target (--compute-ms x slowdown) for {parts}: their speed "
            "is this machine's, not the emulation's; raise --compute-ms or free the cores")
