"""The split ratio between two unequal halves: both should finish a step together.

``alpha`` is the share of every split dimension given to the left half. The
left half's step time grows with ``alpha`` and the right half's shrinks, so
the balanced ratio is the root of ``gap(alpha) = left(alpha) - right(alpha)``.
Without communication and with one half k times faster than the other the
root is ``k / (k + 1)``.

Every trial of ``gap`` plans both halves (a DP per level below), so the search
spends as few as it can. With the types of every level held, each size the
halves see is linear in ``alpha`` and the gap is piecewise linear; the caller's
``slope(alpha, gap)`` measures it cheaply on the tried plan (re-costing its
levels, no DP), and a Newton step from the last trial lands on the root unless
a type or layout changes on the way. Usually two trials: the compute-only
guess and its Newton step. Once trials on both sides of the root are known,
a Newton step outside them, or one that fails to halve them, gives way to the
Illinois variant of regula falsi, so a jump in the gap (where the DP switches
types) still ends in a bracket narrower than ``tol``.

When the step leads past an end of (0, 1) and the gap keeps its sign there,
that end is the answer: one half is slower even with (almost) nothing to do,
as data parallelism on a heterogeneous array typically is.
"""

from __future__ import annotations

import math
from typing import Callable

LO, HI = 1e-3, 1.0 - 1e-3
_SETTLED = 1e-9  # |gap| this small against the largest gap seen counts as balanced


def capacity_ratio(left_flops_per_s: float, right_flops_per_s: float) -> float:
    """Compute-only first guess: each half's share of the aggregate peak throughput."""
    return left_flops_per_s / (left_flops_per_s + right_flops_per_s)


def balance(gap: Callable[[float], float], guess: float, tol: float = 1e-4, max_trials: int = 40,
            slope: Callable[[float, float], float] | None = None):
    """Find ``alpha`` in [LO, HI] where ``gap(alpha) = left_time - right_time`` is zero.

    ``gap`` must increase with ``alpha``. ``slope(alpha, gap_at_alpha)``, if given, is the
    gap's derivative near a tried ratio (see the module doc); without it, and wherever
    it is not positive, the search steps halfway to an end until it brackets the root.
    Returns ``(alpha, trials)``, trials counting distinct ratios tried. If one half is
    slower even with (almost) nothing to do, the bracket end is returned.
    """
    seen: dict[float, float] = {}

    def f(a):
        if a not in seen:
            seen[a] = gap(a)
        return seen[a]

    a = min(max(guess, LO), HI)
    fa = f(a)
    lo = hi = None          # the nearest trials with gap < 0 and gap > 0: (alpha, gap)
    width = math.inf        # bracket width before the last step
    side = 0                # which end the last two Illinois steps moved (to halve the other's gap)
    while True:
        if fa == 0.0 or abs(fa) <= _SETTLED * max(abs(v) for v in seen.values()):
            return a, len(seen)
        if fa < 0:
            lo = (a, fa)
        else:
            hi = (a, fa)
        if lo and hi and hi[0] - lo[0] <= tol:
            return a, len(seen)
        if len(seen) >= max_trials or (not (lo and hi) and a == (HI if fa < 0 else LO)):
            return a, len(seen)  # out of trials, or slower than the other half even at the end
        d = slope(a, fa) if slope else 0.0
        step = a - fa / d if d > 0 and math.isfinite(d) else None
        if lo and hi:
            if step is None or not lo[0] < step < hi[0] or (hi[0] - lo[0]) > width / 2:
                (a_lo, f_lo), (a_hi, f_hi) = lo, hi
                if side == (-1 if fa < 0 else 1):  # the same end moved twice: halve the other's weight
                    f_lo, f_hi = (f_lo, f_hi / 2) if fa < 0 else (f_lo / 2, f_hi)
                    lo, hi = (a_lo, f_lo), (a_hi, f_hi)
                step = (a_lo * f_hi - a_hi * f_lo) / (f_hi - f_lo)
                if not a_lo < step < a_hi:
                    step = (a_lo + a_hi) / 2
            side = -1 if fa < 0 else 1
            width = hi[0] - lo[0]
        else:
            if step is None:
                step = 1 - (1 - a) / 2 if fa < 0 else a / 2
            step = min(max(step, LO), HI)
        if step in seen or step == a:
            return a, len(seen)
        a, fa = step, f(step)
