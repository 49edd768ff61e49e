"""Each worker's standalone speed: the denominator of heterogeneity efficiency.

Heterogeneity efficiency = samples/s achieved / the sum of the workers' standalone speeds, where a
worker's standalone speed is what it would do if it never waited for anyone. How that speed is
known depends on how compute is produced, and the record says which (``efficiency_basis``):

- ``emulated``: with ``--compute-ms T`` a worker of slowdown factor f computes for T*f per
  iteration by construction (a sleep after the real work completes each iteration's target), so its
  standalone iteration is T*f (or its math time, if the math alone is longer); for a trace or random
  slowdowns, the mean over the iterations it ran of the factors it got (a trace's mean over its first
  1,000 iterations, for a worker that ran 150 of them at factor 1, read 4.32). Where the worker's
  achieved compute phase per iteration (measured, :mod:`hetrain.jobs.compute_ledger`) was longer on
  average (a busy machine: late wake-ups, math over the target), that is its standalone iteration: it
  could not have gone faster had it never waited, so the efficiency cannot read above 1 (a start-up
  calibration of 78 ms that stuck, against a 50 ms target, read 2.34). This is the basis of every
  protocol measurement on small machines.
- ``in-run``: with real compute there is no standalone speed to look up. A calibration taken
  before the start barrier, while the other workers still import, measured each worker on idle
  cores; in the run the workers share them, and a straggler's emulated sleep hands its cores to the
  others, so the old figure read above 1 (hop 1.02, prague 1.01). Instead a worker's standalone
  iteration is its own measured compute time per iteration *during the run* (everything between
  two synchronisations: batch, forward, backward, optimizer step, the straggler's sleep). The sum
  of those speeds is what the workers would have done had none of them waited, at the contention
  they actually had, so the figure is the job's non-waiting fraction, weighted by speed, and
  cannot exceed 1 (wall time >= each worker's compute time). What it does not charge: a protocol
  whose background threads slow the math itself (contention for the same cores) looks no worse
  here; samples/s side by side shows that.
"""

from __future__ import annotations

from hetrain.config import RunConfig
from hetrain.slowdown import Slowdown

EMULATED = "emulated"
IN_RUN = "in-run"


def efficiency_basis(config: RunConfig) -> str:
    """``emulated`` when the run emulates its compute time (``--compute-ms``), else ``in-run``."""
    return EMULATED if config.compute_ms else IN_RUN


def standalone_iteration_s(config: RunConfig, slowdown: Slowdown, rank: int, math_s: float,
                           compute_s: float, iterations: int, achieved_s: float | None = None) -> float:
    """Seconds per iteration of worker ``rank`` alone: emulated, or measured in the run (see the module).

    ``achieved_s``: the worker's measured compute phase per iteration, on average (emulated: the
    standalone iteration is never shorter)."""
    if config.compute_ms:
        base_s = config.compute_ms / 1000.0
        if iterations and not slowdown.is_deterministic():  # a trace or random draws: the factors it got
            emulated = sum(max(base_s * slowdown.factor(rank, i), math_s) for i in range(iterations)) / iterations
        else:
            emulated = max(base_s * slowdown.expected_factor(rank), math_s)
        return max(emulated, achieved_s or 0.0)
    return compute_s / iterations if iterations else math_s * slowdown.expected_factor(rank)


def lost_worker_iteration_s(config: RunConfig, slowdown: Slowdown, rank: int, survivors: list[dict]) -> float:
    """The standalone iteration of a worker that died (it sent no record): from the survivors'.

    Emulated: as for any worker, with the survivors' median math time. In-run: the survivors'
    median standalone iteration per unit of slowdown, times the dead worker's slowdown factor.
    """
    math_s = sorted(_work_s(w) for w in survivors)[len(survivors) // 2]
    if config.compute_ms:
        return standalone_iteration_s(config, slowdown, rank, math_s, 0.0, 0)
    per_unit = sorted(w["standalone_iteration_s"] / slowdown.expected_factor(w["rank"]) for w in survivors)
    return per_unit[len(per_unit) // 2] * slowdown.expected_factor(rank)


def _work_s(worker: dict) -> float:
    """A survivor's real work per iteration: its median as measured in the run, else its start-up calibration."""
    phase = worker.get("compute_phase") or {}
    return phase["work_ms_median"] / 1000.0 if phase.get("iterations") else worker["math_s"]
