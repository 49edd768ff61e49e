"""The start barrier of a local job, kept by the launcher: dead workers do not hold it.

Workers used to meet at ``dist.barrier()`` before their first iteration: a collective over the
whole job, so a worker that died before it (while importing, setting up, connecting) held every
survivor there until ``--timeout`` and the job failed (issue 25). Here each worker marks itself
ready in shared memory and waits for the launcher's go; the launcher gives it as soon as every
rank is ready or known dead. A death before training then leaves a job of the survivors (or,
with ``respawn``, a replacement joins the running job as after any death). Under torchrun, where
a death ends the job anyway, the barrier stays ``dist.barrier()``.
"""

from __future__ import annotations

from hetrain.errors import WorkerError

_POLL_S = 0.01


class StartGate:
    """Worker side: ``wait(timeout_s)`` marks this rank ready and returns at the launcher's go."""

    def __init__(self, ready_flags, go, dead_flags, rank: int):
        self._ready = ready_flags
        self._go = go
        self._dead = dead_flags
        self.rank = rank

    def wait(self, timeout_s: float) -> None:
        self._ready[self.rank] = 1
        if not self._go.wait(timeout_s):
            missing = [r for r in range(len(self._ready)) if not self._ready[r] and not self._dead[r]]
            raise WorkerError(f"worker {self.rank} waited {timeout_s:.0f} s at the start for workers {missing} "
                              "to be ready")


def open_if_ready(ready_flags, dead_flags, go) -> bool:
    """Launcher side: give the go once every rank is ready or dead; True once given."""
    if go.is_set():
        return True
    if all(ready_flags[r] or dead_flags[r] for r in range(len(ready_flags))):
        go.set()
        return True
    return False


def admits_replacements(go) -> bool:
    """Launcher side, ``respawn``: whether a ready replacement may join, i.e. the job has started (the go
    is given: every original ready or dead). Before it, an original still building its protocol would take
    the replacement for an original: it would wait for its handshake and never send it a model."""
    return go.is_set()
