"""Times and sizes as people read them: each in the unit that shows its digits (s, ms, µs, ns; GiB, MiB,
KiB, B for memory; GB, MB, kB, B for volumes sent)."""

from __future__ import annotations

import math

_UNITS = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6))
_BINARY = (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10))  # memory
_DECIMAL = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))  # bytes sent


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


def size(nbytes: float, binary: bool = True) -> str:
    """``nbytes`` with four significant digits in the largest unit it reaches: ``1.076 GiB``, ``41.5 KiB``
    (``binary``: memory, as devices state their capacity), or ``505 MB``, ``86.02 kB`` (decimal: bytes sent)."""
    if not math.isfinite(nbytes):
        return "-"
    for unit, scale in _BINARY if binary else _DECIMAL:
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes:.4g} B"
