"""Run a step's group averages on a thread while the next step computes (Prague's ``preduce_overlap``).

The worker snapshots its model after step k and hands the snapshot and step
k's groups to :class:`BackgroundAverage`; a thread runs the P-Reduces on the
snapshot while the worker computes step k+1 on its own model. At the next sync
the worker waits for the thread (usually done by then) and applies the
average as a correction, ``x <- x + (average - snapshot)``: the result is the
group's average plus the worker's own step k+1, taken from the model before
averaging. This is one-step-delayed averaging (as AD-PSGD overlaps its
averaging with computing); docs/concepts/prague.md measures what it does to accuracy.

Groups still run one after another in the order the Group Generator gave (one
thread, and a sync waits for the previous step's groups before it starts the
next ones), so P-Reduce's deadlock freedom is kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

from hetrain.errors import WorkerError
from hetrain.transport.device_thread import device_thread


class BackgroundAverage:
    """At most one step's averaging in flight; ``reduce(flat, groups)`` averages ``flat`` in place."""

    def __init__(self, reduce: Callable[..., None], who: str, timeout_s: float, device=None):
        self._device = device
        self._reduce = reduce
        self._who = who
        self._timeout_s = timeout_s
        self._thread: threading.Thread | None = None
        self._snapshot: torch.Tensor | None = None
        self._average: torch.Tensor | None = None
        self._error: BaseException | None = None
        self._ran = None  # what reduce returned: how many groups ran (None: not counted)
        self.wait_s = 0.0  # time the worker waited for a previous step's averaging
        self.started = 0

    @property
    def pending(self) -> bool:
        return self._thread is not None

    def start(self, snapshot: torch.Tensor, groups: list, *args) -> None:
        """Average ``snapshot`` (the model after this step; not modified) over ``groups`` on a thread
        (``reduce(average, groups, *args)``)."""
        if self._thread is not None:
            raise RuntimeError(f"{self._who}: a step's averaging is already in flight")
        self._snapshot, self._average, self._error = snapshot, snapshot.clone(), None
        self._ran = None
        self._thread = device_thread(self._run, args=(groups, *args), name="hetrain-background-average",
                                     device=self._device)
        self.started += 1

    def _run(self, groups: list, *args) -> None:
        try:
            self._ran = self._reduce(self._average, groups, *args)
        except BaseException as exc:  # raised in the worker's thread by finish()
            self._error = exc

    def finish(self, model: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """Wait for the averaging in flight (if any) and add ``average - snapshot`` to ``model`` in place
        (``transform(average)`` in place of the average when given: an outer optimizer's step, taken only
        if some group ran: where ``reduce`` counted none, every group failed and nothing was averaged)."""
        if self._thread is None:
            return
        began = time.perf_counter()
        self._thread.join(self._timeout_s)
        self.wait_s += time.perf_counter() - began
        if self._thread.is_alive():
            raise WorkerError(f"{self._who} waited {self._timeout_s:.0f} s for its previous step's group averages")
        self._thread = None
        snapshot, average, error = self._snapshot, self._average, self._error
        self._snapshot = self._average = self._error = None
        if error is not None:
            raise error
        if transform is not None and self._ran != 0:
            average = transform(average)
        model.add_(average).sub_(snapshot)
