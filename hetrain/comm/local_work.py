"""Local steps between exchanges, sized to each worker's speed (``local_work="auto"``).

With ``sync_every`` H a worker takes H optimizer steps on its own between two
exchanges with the others (Local SGD, DiLoCo). Under ``local_work="fixed"``
every worker takes H; under ``"auto"`` a worker takes a number proportional
to its speed, ``round(H * fastest_step_s / own_step_s)`` (at least 1, at most
H), re-measured at every exchange, so a worker twice as slow takes half as
many steps and unequal workers reach each exchange at about the same time.
Averages are then weighted by the local steps behind each model
(:func:`weights_by_steps`): a model that took more samples counts more, and
consensus goes to the steps-weighted mean: on symmetric graphs by
:func:`weights_by_steps`, on directed graphs with doubly stochastic weights (the
exponential graph) by :func:`weights_by_circulation`; Prague's weighted P-Reduce
keeps it on any grouping.
"""

from __future__ import annotations

MODES = ("fixed", "auto")
STEP_TIME_EMA = 0.3  # weight of the newest step in a worker's running step time


def steps_per_exchange(sync_every: int, own_step_s: float | None, fastest_step_s: float | None) -> int:
    """Local steps before the next exchange for a worker of ``own_step_s`` when the fastest takes
    ``fastest_step_s`` (either unknown: ``sync_every``)."""
    if not own_step_s or not fastest_step_s or own_step_s <= 0:
        return sync_every
    return max(1, min(sync_every, round(sync_every * fastest_step_s / own_step_s)))


class StepTimer:
    """A worker's running step time (seconds of compute per local step, waits excluded)."""

    def __init__(self):
        self.step_s: float | None = None

    def add(self, seconds: float) -> None:
        self.step_s = seconds if self.step_s is None else self.step_s + STEP_TIME_EMA * (seconds - self.step_s)


def weights_by_steps(weights: list[float], steps: list[int], most_steps: int) -> tuple:
    """Mixing weights by the local steps behind each neighbour's model: (self weight, [weights]).

    Neighbour j's weight ``w_ij`` becomes ``w_ij * s_j / most_steps`` and the worker keeps the rest.
    On a symmetric graph (``w_ij = w_ji``) the flow between two workers is then symmetric in
    ``s_i s_j``, so the mixing keeps the steps-weighted mean ``sum_i s_i x_i / sum_i s_i``
    (detailed balance: a reversible chain whose stationary distribution is proportional to the steps),
    and repeated mixing converges to it. Rescaling whole rows by steps instead (the rule before
    issue 36) does not: the consensus drifts away from both the weighted and the plain mean.
    With every worker at ``most_steps`` the weights are the graph's own.
    """
    scaled = [w * s / most_steps for w, s in zip(weights, steps)]
    return 1.0 - sum(scaled), scaled


def weights_by_circulation(weights: list[float], own_steps: int, slowest_steps: int) -> tuple:
    """Mixing weights for a graph whose own weights are doubly stochastic but not symmetric (a
    directed regular graph: the exponential graph): (self weight, [weights]).

    Every neighbour weight ``w_ij`` becomes ``w_ij * s_min / s_i`` (``s_i``: this worker's local steps,
    ``s_min``: the slowest live worker's) and the worker keeps the rest. The steps-weighted flow from
    j to i is then ``s_i W_ij = s_min w_ij``, the graph's weights times one number for the whole
    job: what j gives its out-neighbours, ``s_min (1 - w_jj)`` by the columns' sums, equals what it
    takes from its in-neighbours by the rows', so ``sum_i s_i x_i`` is kept by every exchange and
    repeated mixing converges to ``sum_i s_i x_i / sum_i s_i`` (the stationary distribution of the
    chain is proportional to the steps). Which steps are whose comes from the job's speed board
    (:mod:`hetrain.runtime.speed_board`); the weighted mean is exact while the workers read the same
    slowest steps. The price: a worker s_i / s_min times faster than the slowest mixes that much
    less with its neighbours. With every worker at the same steps the weights are the graph's own.
    """
    scale = min(1.0, slowest_steps / own_steps) if own_steps > 0 else 1.0
    scaled = [w * scale for w in weights]
    return 1.0 - sum(scaled), scaled
