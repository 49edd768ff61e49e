"""Emulated compute for Lightning runs: each training batch sleeps ``compute_ms`` times the rank's slowdown.

Used by the examples, the benchmark and the tests to make one rank slower the
same way under every strategy (Lightning's ``"ddp"`` included): the sleep comes
before the forward pass (under DDP the backward pass holds the all-reduce, so a
sleep after it would overlap the others' wait). The real forward/backward comes
on top, the same on every rank, so a rank of factor 3 is a little less than 3x
slower when the real math is not small beside ``compute_ms``. ``slowdown`` is a
hetrain slowdown spec (``"0:3x"``: rank 0 three times slower; see hetrain.slowdown).
"""

from __future__ import annotations

import time

from hetrain.extras import require

require("lightning", "lightning", "EmulatedCompute")

from lightning.pytorch.callbacks import Callback  # noqa: E402

from hetrain.slowdown import parse_slowdown  # noqa: E402


class EmulatedCompute(Callback):
    """Also counts this rank's batches and samples, and ``compute_s``: the time from each batch's start
    to its optimizer step (sleep, forward, backward; under DDP the backward's all-reduce too)."""

    def __init__(self, compute_ms: float, slowdown: str = "none"):
        self.sleep_s = compute_ms / 1000.0
        self.slowdown = parse_slowdown(slowdown)
        self.batches = 0
        self.samples = 0
        self.compute_s = 0.0
        self._began: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._began = time.perf_counter()
        factor = self.slowdown.factor(trainer.global_rank, self.batches)
        if self.sleep_s > 0:
            time.sleep(self.sleep_s * factor)
        self.batches += 1
        self.samples += len(batch[0]) if isinstance(batch, (list, tuple)) else len(batch)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self._began is not None:
            self.compute_s += time.perf_counter() - self._began
            self._began = None
