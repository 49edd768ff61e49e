"""Where a job's start and end go: per worker ``import_s``, ``setup_s``, ``connect_s``, ``finish_s``.

- ``import_s``: from the launcher starting the process until the worker's code runs (a fork of
  the warm server, and whatever the function's module imports beyond it);
- ``setup_s``: data, model, calibration, optimizer, snapshots (and a checkpoint's restore);
- ``connect_s``: the default process group, the protocol's connections and handshakes, the start
  barrier (a fast worker waits there for the slowest one: that wait counts here);
- ``finish_s``: from the end of the training loop to the result: evaluation, final averaging,
  the last checkpoint, the snapshots made ready to send.

The job adds ``startup_s`` (launch to the moment every worker has computed its first iteration),
``startup_launcher_s`` (launch to its first worker's start) and ``teardown_s`` (all results in to the record written); see :func:`hetrain.jobs.run.finalize_run`.
"""

from __future__ import annotations

import time

WORKER_PHASES = ("import_s", "setup_s", "connect_s", "finish_s")


class PhaseClock:
    """Lap times on the wall clock (``time.time()``, comparable with the launcher's), added per phase."""

    def __init__(self, phases: dict | None = None):
        self.phases = {key: 0.0 for key in WORKER_PHASES}
        self.phases.update(phases or {})
        self._last = time.time()

    def lap(self, phase: str | None) -> None:
        """Charge the time since the last lap to ``phase`` (None: to no phase, e.g. training)."""
        now = time.time()
        if phase is not None:
            self.phases[phase] = self.phases.get(phase, 0.0) + (now - self._last)
        self._last = now

    def mark(self, name: str) -> None:
        """Record the wall-clock time of an event (e.g. ``first_iteration_at``)."""
        self.phases[name] = time.time()


def job_phases(workers: list[dict], launched_at: float | None) -> dict:
    """The job's ``startup_s`` and its slowest starter's phases, from the workers' records.

    Each worker's absolute times (``launched_at``, ``first_iteration_at``) become ``started_s`` and
    ``first_iteration_s``: seconds from the job's launch. ``startup_launcher_s``: launch to the first
    worker's start (the launcher's own imports, data and set-up). Only the job's original workers count for
    ``startup_s`` (a replacement starts later by design); None if one of them never computed.
    """
    for w in workers:
        first, started = w.pop("first_iteration_at", None), w.pop("launched_at", None)
        known = launched_at is not None
        w["first_iteration_s"] = first - launched_at if first is not None and known else None
        w["started_s"] = started - launched_at if started is not None and known else None
    originals = [w for w in workers if not w.get("incarnation")]
    started = [w["started_s"] for w in originals if w["started_s"] is not None]
    record = {"startup_s": None, "startup_launcher_s": min(started) if started else None,
              "startup_slowest_worker": None,
              "finish_s_max_worker": max((w["finish_s"] for w in workers), default=None)}
    if originals and all(w["first_iteration_s"] is not None for w in originals):
        slowest = max(originals, key=lambda w: w["first_iteration_s"])
        record.update(startup_s=slowest["first_iteration_s"],
                      startup_slowest_worker={"rank": slowest["rank"], **{k: slowest[k] for k in WORKER_PHASES[:3]}})
    return record
