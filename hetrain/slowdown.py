"""Heterogeneity injection: how much slower each worker is at each iteration.

One spec is shared by the runtime (a worker sleeps for the extra time) and the
simulator (the compute time is multiplied). Specs:

* ``none`` -- every worker at full speed;
* ``I:Kx[,J:Lx...]`` -- worker I is K times slower at every iteration (the ``x`` is optional);
* ``every:N:Kx`` -- workers 0, N, 2N, ... are K times slower (one in N);
* ``random:p=P,factor=K`` -- each iteration of each worker is K times slower with probability P
  (deterministic for a seed, so a simulator and a real run see the same draws);
* ``trace:PATH`` -- a CSV file with the header ``worker,iteration,factor``; rows not listed are 1.0.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field

from hetrain.errors import UsageError

_MASK64 = (1 << 64) - 1


def _uniform(seed: int, worker: int, iteration: int) -> float:
    """A deterministic uniform draw in [0, 1) for (seed, worker, iteration) (splitmix64)."""
    z = (seed * 0x9E3779B97F4A7C15 + worker * 0xBF58476D1CE4E5B9 + iteration * 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return (z >> 11) / float(1 << 53)


@dataclass(frozen=True)
class Slowdown:
    """A parsed slowdown spec: ``factor(worker, iteration)`` >= 1 is the compute-time multiplier."""

    spec: str = "none"
    fixed: dict = field(default_factory=dict)  # worker -> factor at every iteration
    every: tuple = ()  # (N, K): workers 0, N, 2N, ... are K times slower
    random_p: float = 0.0
    random_factor: float = 1.0
    trace: dict = field(default_factory=dict)  # (worker, iteration) -> factor
    seed: int = 0

    def factor(self, worker: int, iteration: int) -> float:
        if self.trace:
            return self.trace.get((worker, iteration), 1.0)
        if self.random_p > 0.0:
            return self.random_factor if _uniform(self.seed, worker, iteration) < self.random_p else 1.0
        if self.every:
            return self.every[1] if worker % self.every[0] == 0 else 1.0
        return self.fixed.get(worker, 1.0)

    def expected_factor(self, worker: int, iterations: int = 1000) -> float:
        """The mean multiplier of ``worker`` (over the first ``iterations`` for a trace)."""
        if self.trace:
            return sum(self.factor(worker, it) for it in range(iterations)) / iterations
        if self.random_p > 0.0:
            return 1.0 + self.random_p * (self.random_factor - 1.0)
        return self.factor(worker, 0)

    def is_deterministic(self) -> bool:
        """True when each worker's factor does not change from iteration to iteration."""
        return not self.trace and self.random_p == 0.0

    def check_workers(self, num_workers: int) -> Slowdown:
        """Raise UsageError if the spec names a worker outside 0..num_workers-1."""
        named = set(self.fixed) | {worker for worker, _ in self.trace}
        bad = sorted(w for w in named if not 0 <= w < num_workers)
        if bad:
            raise UsageError(
                f"--slowdown {self.spec!r} names worker {bad[0]}, but workers are 0..{num_workers - 1}; "
                "use a worker index below --workers"
            )
        return self


def parse_slowdown(spec: str, seed: int = 0) -> Slowdown:
    """Parse a slowdown spec (see the module docstring); raise UsageError on a malformed one."""
    text = (spec or "none").strip()
    if text.lower() == "none":
        return Slowdown("none", seed=seed)
    if text.startswith("random:"):
        return _parse_random(text, seed)
    if text.startswith("every:"):
        return _parse_every(text, seed)
    if text.startswith("trace:"):
        return Slowdown(text, trace=_read_trace(text[len("trace:") :]), seed=seed)
    fixed = {}
    for part in text.split(","):
        worker_text, sep, factor_text = part.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            worker = int(worker_text)
            factor = float(factor_text.strip().rstrip("xX"))
        except ValueError:
            raise UsageError(
                f"malformed slowdown {spec!r}: expected none, I:Kx[,J:Lx], every:N:Kx, random:p=P,factor=K or trace:FILE"
            ) from None
        if worker < 0 or _bad_factor(factor):
            raise UsageError(
                f"slowdown {part.strip()!r}: the worker must be >= 0 and the factor >= 1 (e.g. 2:5x)"
            )
        if worker in fixed:
            raise UsageError(f"slowdown {spec!r} names worker {worker} twice; give each worker one factor")
        fixed[worker] = factor
    return Slowdown(text, fixed=fixed, seed=seed)


def _bad_factor(factor: float) -> bool:
    """A slowdown factor must be a finite number >= 1 (NaN and infinity fail the comparison)."""
    return not 1.0 <= factor < math.inf


def _parse_every(text: str, seed: int) -> Slowdown:
    parts = text.split(":")
    try:
        if len(parts) != 3:
            raise ValueError
        stride, factor = int(parts[1]), float(parts[2].rstrip("xX"))
    except ValueError:
        raise UsageError(f"malformed slowdown {text!r}: expected every:N:Kx (e.g. every:8:5x)") from None
    if stride < 1 or _bad_factor(factor):
        raise UsageError(f"slowdown {text!r}: need N >= 1 and K >= 1 (e.g. every:8:5x)")
    return Slowdown(text, every=(stride, factor), seed=seed)


def _parse_random(text: str, seed: int) -> Slowdown:
    fields = {}
    for item in text[len("random:") :].split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"malformed slowdown {text!r}: expected random:p=P,factor=K (e.g. random:p=0.1,factor=6)")
        fields[key.strip()] = value.strip()
    if set(fields) != {"p", "factor"}:
        raise UsageError(f"malformed slowdown {text!r}: random takes exactly p=P and factor=K")
    try:
        p, factor = float(fields["p"]), float(fields["factor"].rstrip("xX"))
    except ValueError:
        raise UsageError(f"malformed slowdown {text!r}: p and factor must be numbers") from None
    if not 0.0 <= p <= 1.0 or _bad_factor(factor):
        raise UsageError(f"slowdown {text!r}: need 0 <= p <= 1 and factor >= 1")
    return Slowdown(text, random_p=p, random_factor=factor, seed=seed)


def _read_trace(path: str) -> dict:
    try:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        raise UsageError(f"slowdown trace {path!r}: cannot read it ({exc.strerror})") from None
    trace = {}
    for line, row in enumerate(rows, start=2):
        try:
            worker, iteration, factor = int(row["worker"]), int(row["iteration"]), float(row["factor"])
        except (KeyError, TypeError, ValueError):
            raise UsageError(
                f"slowdown trace {path!r} line {line}: expected the header worker,iteration,factor "
                "and integer,integer,number rows"
            ) from None
        if worker < 0 or iteration < 0 or _bad_factor(factor):
            raise UsageError(f"slowdown trace {path!r} line {line}: need worker, iteration >= 0 and factor >= 1")
        trace[(worker, iteration)] = factor
    if not trace:
        raise UsageError(f"slowdown trace {path!r} has no rows; add worker,iteration,factor lines")
    return trace
