"""Times as people read them: each in the unit that shows its digits (s, ms, µs, ns)."""

from __future__ import annotations

import math

_UNITS = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6))


def duration(seconds: float) -> str:
    """``seconds`` with four significant digits in the largest unit it reaches: ``71.4 ms``, ``38.01 µs``."""
    if not math.isfinite(seconds):
        return "-"
    if seconds == 0:
        return "0 s"
    for unit, scale in _UNITS:
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"
