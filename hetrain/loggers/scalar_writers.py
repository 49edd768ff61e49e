"""Where a run's figures over time go: CSV (the default), TensorBoard, W&B (offline), MLflow (a local file store).

A scalar writer is anything with::

    add_scalar(tag, value, step, walltime=None)   # TensorBoard's SummaryWriter has this shape
    flush()
    close()

``make_writers(kinds, run_dir, run_name, config)`` builds one per kind and returns them as one
:class:`FanOut`. Each backend is imported only when its kind is asked for (``csv`` needs nothing);
``check_log_packages(kinds)`` fails first, in one line naming the extra, when a package is missing.
Where the files go (``run_dir`` is a run's output directory; ``shared_dir`` holds what a comparison's
runs share, by default ``run_dir``):

- ``csv``: ``run_dir/scalars.csv``, columns ``step, walltime, tag, value``;
- ``tensorboard``: the event file in ``run_dir`` (``tensorboard --logdir`` over a comparison's
  directory shows one run per protocol);
- ``wandb``: ``run_dir/wandb/offline-run-*`` (mode offline unless the user set ``WANDB_MODE``);
- ``mlflow``: the file store ``shared_dir/mlruns``, experiment ``hetrain``, one run per ``run_name``
  (unless the user set ``MLFLOW_TRACKING_URI``).

The tags hetrain writes are listed in docs/guides/logging.md.
"""

from __future__ import annotations

import csv
import importlib.util
import time
from pathlib import Path
from typing import Protocol

from hetrain.protocols.options import OptionError

LOG_KINDS = ("csv", "tensorboard", "wandb", "mlflow")
# kind -> (the module it imports, the package that provides it, hetrain's extra)
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard", "tensorboard"),
            "wandb": ("wandb", "wandb", "wandb"),
            "mlflow": ("mlflow", "mlflow-skinny", "mlflow")}


class ScalarWriter(Protocol):
    def add_scalar(self, tag: str, value: float, step: int, walltime: float | None = None) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def parse_log_kinds(text: str | None) -> tuple[str, ...]:
    """``"csv,tensorboard"`` -> ``("csv", "tensorboard")`` (each once, in order); ``none`` or empty -> ()."""
    names = [k.strip().lower() for k in (text or "").split(",") if k.strip()]
    return tuple(dict.fromkeys(k for k in names if k != "none"))


def check_log_kinds(kinds) -> None:
    """Raise OptionError (``{log}``: the CLI shows ``--log``) for an unknown kind."""
    for kind in kinds:
        if kind not in LOG_KINDS:
            raise OptionError(f"unknown {{log}} kind {kind!r}; choose from {', '.join(LOG_KINDS)} "
                              "(comma-separated), or none")


def check_log_packages(kinds) -> None:
    """Raise OptionError naming the extra when a kind's package is not installed (nothing is imported)."""
    for kind in kinds:
        if kind in PACKAGES:
            module, package, extra = PACKAGES[kind]
            if not _installed(module):
                raise OptionError(f"{{log}} {kind} needs the {package} package: pip install 'hetrain[{extra}]'")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


class CsvWriter:
    """Scalars as rows of ``path`` (``step, walltime, tag, value``), flushed on ``flush()``."""

    HEADER = ("step", "walltime", "tag", "value")

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file = open(self.path, "w", newline="")
        self._rows = csv.writer(self._file)
        self._rows.writerow(self.HEADER)

    def add_scalar(self, tag: str, value: float, step: int, walltime: float | None = None) -> None:
        self._rows.writerow((int(step), f"{time.time() if walltime is None else walltime:.3f}", tag,
                             repr(float(value))))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class FanOut:
    """Several writers as one; ``close()`` closes each even if one fails."""

    def __init__(self, writers: list):
        self.writers = list(writers)

    def add_scalar(self, tag: str, value: float, step: int, walltime: float | None = None) -> None:
        for writer in self.writers:
            writer.add_scalar(tag, value, step, walltime)

    def flush(self) -> None:
        for writer in self.writers:
            writer.flush()

    def close(self) -> None:
        errors = []
        for writer in self.writers:
            try:
                writer.close()
            except Exception as exc:  # the others still get closed
                errors.append(exc)
        if errors:
            raise errors[0]


def make_writers(kinds, run_dir: str | Path, run_name: str, config: dict | None = None,
                 shared_dir: str | Path | None = None) -> FanOut:
    """One writer per kind (see the module), as a :class:`FanOut`; ``config``: the run's settings
    (W&B's config, MLflow's params)."""
    check_log_kinds(kinds)
    check_log_packages(kinds)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    writers = []
    try:
        for kind in kinds:
            if kind == "csv":
                writers.append(CsvWriter(run_dir / "scalars.csv"))
            elif kind == "tensorboard":
                from hetrain.loggers.tensorboard_writer import TensorBoardWriter

                writers.append(TensorBoardWriter(run_dir))
            elif kind == "wandb":
                from hetrain.loggers.wandb_writer import WandbWriter

                writers.append(WandbWriter(run_dir, run_name, config))
            elif kind == "mlflow":
                from hetrain.loggers.mlflow_writer import MlflowWriter

                writers.append(MlflowWriter(Path(shared_dir or run_dir) / "mlruns", run_name, config))
    except BaseException:
        FanOut(writers).close()
        raise
    return FanOut(writers)
