"""Fault injection specs, shared by the runtime (the launcher SIGKILLs workers) and the simulator.

``--fail`` takes:

- ``none`` (default);
- ``W@Ts[,V@Us...]``: worker W is killed T seconds into training (``3@20s``,
  ``3@20s,5@40s``; the ``s`` is optional);
- ``random:rate=R``: failures arrive as a Poisson process of R per minute over
  the whole job, each killing a worker drawn at random among those alive
  (seeded: the same seed gives the same kills).

A spec is pure data: :meth:`FailSpec.kills` lists ``(time_s, worker)`` up to a
horizon, so the launcher and the simulator kill the same workers at the same
times.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from hetrain.errors import UsageError

_AT = re.compile(r"^(\d+)@(\d+(?:\.\d*)?)s?$")


@dataclass(frozen=True)
class FailSpec:
    text: str
    fixed: tuple[tuple[float, int], ...] = ()  # (time_s, worker), sorted
    rate_per_min: float = 0.0
    seed: int = 0

    @property
    def active(self) -> bool:
        return bool(self.fixed) or self.rate_per_min > 0

    def check_workers(self, num_workers: int, repeats: bool = False) -> FailSpec:
        """Refuse workers outside the job, and (unless ``repeats``: respawn brings a worker back) the
        same worker killed twice."""
        bad = [w for _, w in self.fixed if w >= num_workers]
        if bad:
            raise UsageError(f"--fail {self.text!r} names worker {bad[0]}, but the job has workers "
                             f"0..{num_workers - 1}")
        if not repeats and len({w for _, w in self.fixed}) < len(self.fixed):
            raise UsageError(f"--fail {self.text!r} kills a worker twice; name each worker once "
                             "(or use --on-failure respawn, which brings it back)")
        return self

    def kills(self, num_workers: int, horizon_s: float) -> list[tuple[float, int]]:
        """Every (time_s, worker) kill up to ``horizon_s``; never the last worker alive."""
        if not self.rate_per_min:
            return [k for k in self.fixed if k[0] <= horizon_s]
        rng = random.Random(self.seed * 7919 + 17)
        alive = list(range(num_workers))
        kills, t = [], 0.0
        while len(alive) > 1:
            t += rng.expovariate(self.rate_per_min / 60.0)
            if t > horizon_s:
                break
            worker = alive.pop(rng.randrange(len(alive)))
            kills.append((t, worker))
        return kills


def parse_fail(text: str | None, seed: int = 0) -> FailSpec:
    """Parse a ``--fail`` spec; UsageError with the accepted forms when malformed."""
    text = (text or "none").strip()
    if text == "none":
        return FailSpec(text)
    if text.startswith("random:"):
        key, _, value = text[len("random:"):].partition("=")
        try:
            rate = float(value)
        except ValueError:
            rate = -1.0
        if key.strip() != "rate" or not rate > 0:
            raise UsageError(f"--fail {text!r}: random takes rate=R, failures per minute (R > 0), "
                             "e.g. random:rate=1")
        return FailSpec(text, rate_per_min=rate, seed=seed)
    fixed = []
    for part in text.split(","):
        match = _AT.match(part.strip())
        if not match:
            raise UsageError(f"--fail {text!r}: expected none, W@Ts[,V@Us] (e.g. 3@20s,5@40s) or random:rate=R")
        fixed.append((float(match.group(2)), int(match.group(1))))
    return FailSpec(text, tuple(sorted(fixed)), seed=seed)
