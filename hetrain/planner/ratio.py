"""The split ratio between two unequal halves: both should finish a step together.

``alpha`` is the share of every split dimension given to the left half. The
left half's step time grows with ``alpha`` and the right half's shrinks, so
the balanced ratio is the root of ``left(alpha) - right(alpha)``; it is found
by the Illinois variant of regula falsi on a bracket (a handful of trials,
each of which plans both halves). Without communication and with one half k
times faster than the other the root is ``k / (k + 1)``.

When the first step away from the guess keeps the gap's sign, the end of the
bracket is probed at once: if the sign holds there too, the end is the answer
(with a gap that increases with ``alpha``, the step-by-step walk would have
reached the same end), which saves the walk's remaining trials (data
parallelism on a heterogeneous array typically runs to the end).
"""

from __future__ import annotations

from typing import Callable

LO, HI = 1e-3, 1.0 - 1e-3


def capacity_ratio(left_flops_per_s: float, right_flops_per_s: float) -> float:
    """Compute-only first guess: each half's share of the aggregate peak throughput."""
    return left_flops_per_s / (left_flops_per_s + right_flops_per_s)


def balance(gap: Callable[[float], float], guess: float, tol: float = 1e-4, max_trials: int = 40):
    """Find ``alpha`` in (0, 1) where ``gap(alpha) = left_time - right_time`` is zero.

    ``gap`` must increase with ``alpha``. Returns ``(alpha, trials)``, trials
    counting distinct ratios tried. If one half is slower even with (almost)
    nothing to do, the bracket end is returned.
    """
    trials = 0
    seen: dict[float, float] = {}
    probed = []

    def f(a):
        nonlocal trials
        if a not in seen:
            trials += 1
            seen[a] = gap(a)
        return seen[a]

    def steps_probe(at, end):
        """Probe the end once, after the first step that kept the sign."""
        if probed or at == end:
            return False
        probed.append(end)
        return True

    guess = min(max(guess, LO), HI)
    fg = f(guess)
    if fg == 0.0:
        return guess, trials
    # bracket the root starting from the guess
    if fg > 0:
        hi, fhi = guess, fg
        lo = guess
        while True:
            lo = max(LO, lo / 2)
            flo = f(lo)
            if flo <= 0 or lo == LO:
                break
            if steps_probe(lo, LO) and f(LO) > 0:
                return LO, trials
            hi, fhi = lo, flo
        if flo > 0:
            return LO, trials
    else:
        lo, flo = guess, fg
        hi = guess
        while True:
            hi = min(HI, 1 - (1 - hi) / 2)
            fhi = f(hi)
            if fhi >= 0 or hi == HI:
                break
            if steps_probe(hi, HI) and f(HI) < 0:
                return HI, trials
            lo, flo = hi, fhi
        if fhi < 0:
            return HI, trials
    side = 0
    a = lo
    while hi - lo > tol and trials < max_trials:
        a = (lo * fhi - hi * flo) / (fhi - flo)
        if not lo < a < hi:
            a = (lo + hi) / 2
        fa = f(a)
        if fa == 0.0:
            return a, trials
        if fa < 0:
            lo, flo = a, fa
            if side == -1:
                fhi /= 2
            side = -1
        else:
            hi, fhi = a, fa
            if side == 1:
                flo /= 2
            side = 1
        if abs(fa) <= tol * 1e-3 * max(abs(flo), abs(fhi), 1e-30):
            break
    return a, trials
