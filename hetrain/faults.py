"""Fault injection specs, shared by the runtime (the launcher SIGKILLs workers) and the simulator.

``--fail`` takes:

- ``none`` (default);
- ``W@Ts[,V@Us...]``: worker W is killed T seconds into training (``3@20s``,
  ``3@20s,5@40s``; the ``s`` is optional);
- ``W@wall:Ts``: T seconds of wall time after the launch (start-up included);
- ``W@PHASE``: as worker W enters a phase: ``startup`` (its process has just
  started), ``connect`` (it builds its protocol: connections, Hop's handshake,
  the start barrier), ``checkpoint`` (it writes its first checkpoint),
  ``finish`` (its final averaging);
- any of those with ``:stop``: SIGSTOP instead of SIGKILL (``3@20s:stop``): the
  worker hangs without dying, as on a stuck host, and the launcher's heartbeat
  check finds it (``--heartbeat-timeout``);
- ``random:rate=R``: failures arrive as a Poisson process of R per minute over
  the whole job, each killing a worker drawn at random among those alive
  (seeded: the same seed gives the same kills).

A spec is pure data: :meth:`FailSpec.kills` lists the training-clock SIGKILLs
``(time_s, worker)`` up to a horizon, so the launcher and the simulator kill
the same workers at the same times; :attr:`FailSpec.events` holds every fault
(:class:`Fault`), which the launcher fires. The simulator models the training
clock's kills only and refuses the rest (:meth:`FailSpec.unmodelled`).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from hetrain.errors import UsageError

_NUMBER = r"(\d+(?:\.\d*)?)s?"
_AT = re.compile(rf"^(\d+)@{_NUMBER}$")
_WALL = re.compile(rf"^(\d+)@wall:{_NUMBER}$")
PHASES = ("startup", "connect", "checkpoint", "finish")
_PHASE = re.compile(rf"^(\d+)@({'|'.join(PHASES)})$")
SIGNALS = ("kill", "stop")
FORMS = ("none, W@Ts[,V@Us] (e.g. 3@20s,5@40s), W@wall:Ts, W@PHASE (PHASE: " + ", ".join(PHASES)
         + "), any of them with :stop (SIGSTOP instead of SIGKILL), or random:rate=R")


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``signal`` (kill: SIGKILL, stop: SIGSTOP) to ``worker`` when ``clock``
    (train: the training clock; wall: seconds since the launch; phase: as it enters ``phase``) says."""

    worker: int
    clock: str
    at_s: float = 0.0
    phase: str | None = None
    signal: str = "kill"

    def describe(self) -> str:
        when = self.phase if self.clock == "phase" else f"wall:{self.at_s:g}s" if self.clock == "wall" \
            else f"{self.at_s:g}s"
        return f"{self.worker}@{when}" + (":stop" if self.signal == "stop" else "")


@dataclass(frozen=True)
class FailSpec:
    text: str
    fixed: tuple[tuple[float, int], ...] = ()  # (time_s, worker), sorted: the training clock's SIGKILLs
    rate_per_min: float = 0.0
    seed: int = 0
    events: tuple[Fault, ...] = ()  # every fault the spec names (the fixed kills among them)

    @property
    def active(self) -> bool:
        return bool(self.events) or self.rate_per_min > 0

    def unmodelled(self) -> list[Fault]:
        """Faults the simulator cannot model: off the training clock, or SIGSTOP."""
        return [e for e in self.events if e.clock != "train" or e.signal != "kill"]

    def check_workers(self, num_workers: int, repeats: bool = False) -> FailSpec:
        """Refuse workers outside the job, and (unless ``repeats``: respawn brings a worker back) the
        same worker killed twice."""
        bad = [e.worker for e in self.events if e.worker >= num_workers]
        if bad:
            raise UsageError(f"--fail {self.text!r} names worker {bad[0]}, but the job has workers "
                             f"0..{num_workers - 1}")
        if not repeats and len({e.worker for e in self.events}) < len(self.events):
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
    events = [_parse_fault(part.strip(), text) for part in text.split(",")]
    fixed = sorted((e.at_s, e.worker) for e in events if e.clock == "train" and e.signal == "kill")
    return FailSpec(text, tuple(fixed), seed=seed, events=tuple(events))


def _parse_fault(part: str, text: str) -> Fault:
    body, signal = part, "kill"
    for kind in SIGNALS:
        if part.endswith(":" + kind):
            body, signal = part[: -len(kind) - 1], kind
    if match := _AT.match(body):
        return Fault(int(match.group(1)), "train", float(match.group(2)), signal=signal)
    if match := _WALL.match(body):
        return Fault(int(match.group(1)), "wall", float(match.group(2)), signal=signal)
    if match := _PHASE.match(body):
        return Fault(int(match.group(1)), "phase", phase=match.group(2), signal=signal)
    raise UsageError(f"--fail {text!r}: expected {FORMS}")
