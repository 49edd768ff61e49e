"""A W&B run, offline by default: files under the run's directory, nothing sent (hetrain[wandb]).

The run is offline unless the user set ``WANDB_MODE`` (``online`` sends it; ``wandb sync DIR`` uploads
an offline run later). W&B wants each row's step to grow, and hetrain writes some figures after
the run for times already passed (the averaged model's accuracy), so the x axis is a metric of its
own, ``step`` (``define_metric("*", step_metric="step")``), and W&B's ``_step`` just counts rows.
Scalars of one step go out as one row.
"""

from __future__ import annotations

import os
from pathlib import Path

from hetrain.extras import require

STEP_KEY = "step"


class WandbWriter:
    def __init__(self, run_dir: str | Path, run_name: str, config: dict | None = None,
                 project: str | None = None, group: str | None = None):
        wandb = require("wandb", "wandb", "logging to W&B")
        self._run = wandb.init(
            mode=os.environ.get("WANDB_MODE", "offline"), dir=str(run_dir),
            project=project or os.environ.get("WANDB_PROJECT", "hetrain"), name=run_name, group=group,
            config=_plain(config or {}),
            settings=wandb.Settings(console="off", silent=True))
        self._run.define_metric(STEP_KEY)
        self._run.define_metric("*", step_metric=STEP_KEY)
        self._step: int | None = None
        self._row: dict = {}

    @property
    def run_dir(self) -> Path:
        """The run's own directory (``.../wandb/offline-run-*``), with its ``run-*.wandb`` log."""
        return Path(self._run.dir).parent

    def add_scalar(self, tag: str, value: float, step: int, walltime: float | None = None) -> None:
        if step != self._step or tag in self._row:
            self._emit()
            self._step = int(step)
        self._row[tag] = float(value)

    def _emit(self) -> None:
        if self._row:
            self._run.log({**self._row, STEP_KEY: self._step})
            self._row = {}

    def flush(self) -> None:
        self._emit()

    def close(self) -> None:
        self._emit()
        self._run.finish()


def _plain(config: dict) -> dict:
    """The run's settings as W&B config values (tuples as lists, the rest as they are or as text)."""
    return {k: list(v) if isinstance(v, tuple) else v if isinstance(v, (int, float, str, bool, type(None), list, dict))
            else str(v) for k, v in config.items()}
