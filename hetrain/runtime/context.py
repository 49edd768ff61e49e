"""What the local launcher hands each worker function: its place in the job and a line to the launcher."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hetrain.runtime.job import DEFAULT_TIMEOUT_S


@dataclass
class WorkerContext:
    """One local worker's view of :func:`hetrain.runtime.local_job.run_local`'s job.

    The default process group is initialised before ``fn(ctx, ...)`` runs, so
    protocols built inside take ``process_group=None``. ``report(message)``
    sends a picklable message to the launcher (progress); ``stop_requested()``
    turns True once the launcher asks the workers to stop (Ctrl-C);
    ``dead_workers()`` is the set of ranks the launcher has found dead, which
    the protocols repair around when ``continue_on_death``.
    """

    rank: int
    world_size: int
    device: torch.device
    timeout_s: float = DEFAULT_TIMEOUT_S
    report: Callable[[object], None] | None = None
    stop_requested: Callable[[], bool] | None = None
    dead_workers: Callable[[], set[int]] | None = None  # ranks the launcher found dead (continue mode)
    continue_on_death: bool = False

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_s)
