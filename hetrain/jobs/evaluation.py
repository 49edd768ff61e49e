"""Quality over time, after the run: the averaged model's curve and the worst worker's time to target.

Every worker keeps snapshots of its own model (:mod:`hetrain.jobs.snapshots`). At each tick the
launcher takes each worker's latest snapshot due by then and evaluates

- their average: ``accuracy_avg_model`` / ``loss_avg_model``, the curve that ``time_to_target_s``
  reads. No worker holds that model during training (the decentralized protocols only form it in
  ``finish()``), so it flatters a protocol whose workers disagree;
- each worker's own model, for ``time_to_target_worst_worker_s``: the first tick at which every
  worker's own model (the worst of them) reaches the target. This is what a user who stops the job
  early and takes any one worker's model gets.

The worst worker is found lazily: at a tick, the workers are tried starting with the one that
missed the target last, and the first miss ends the tick. A tick before the target costs about one
extra evaluation, not one per worker (the byte-level LM's evaluation takes 0.44 s here); each tick's
outcome (``worst_worker_at_target``) is in the curve up to the first hit.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from tqdm import tqdm

from hetrain.config import RunConfig
from hetrain.data import Dataset, build_model, evaluate, load_dataset
from hetrain.runtime.flat_state import FlatState


def evaluation_curve(config: RunConfig, snapshots_by_worker: list[list], data: Dataset | None = None,
                     progress: bool = False) -> tuple[list[dict], float | None]:
    """(curve, time_to_target_worst_worker_s) from the workers' snapshots (see the module).

    Snapshots are ``(due_s, t_s, iteration, flat)``; at each due time every worker
    contributes its latest snapshot due at or before it (a replacement, from the first tick after it
    joined: before, it pinned every earlier tick to its join, and the times to target with them). ``data``: the workload's data (None: load it).
    ``progress``: a bar on stderr, one step a tick (the LM's 0.44 s evaluations add up to tens of seconds).
    """
    if not all(snapshots_by_worker):
        return [], None
    data = data if data is not None else load_dataset(config.workload, config.seed)
    model = build_model(config.workload, config.model_params, config.seed)
    state = FlatState(model)

    def score(flat: np.ndarray) -> tuple[float, float]:
        state.scatter(torch.from_numpy(flat if flat.flags.writeable else flat.copy()))  # read-only: from Ray
        return evaluate(model, data.x_test, data.y_test)

    target_loss = config.resolved_target_loss()

    def at_target(accuracy: float, loss: float) -> bool:
        return loss <= target_loss if target_loss is not None else accuracy >= config.target_accuracy

    worst = _WorstWorker(len(snapshots_by_worker), score, at_target)
    due_times = sorted({snap[0] for snaps in snapshots_by_worker for snap in snaps})
    curve = []
    for due in tqdm(due_times, desc=f"evaluating the models kept every {config.resolved_eval_interval_s():g} s",
                    unit="point", file=sys.stderr, disable=not progress, leave=False, dynamic_ncols=True,
                    mininterval=0.1 if sys.stderr.isatty() else 5.0):
        chosen = {}  # worker -> its latest snapshot due by then; a replacement that joined later has none yet
        for worker, snaps in enumerate(snapshots_by_worker):
            before = [s for s in snaps if s[0] <= due]
            if before:
                chosen[worker] = before[-1]
        if not chosen:
            continue
        accuracy, loss = score(np.mean([s[3] for s in chosen.values()], axis=0))
        point = {
            "t_s": max(s[1] for s in chosen.values()),
            "accuracy_avg_model": accuracy,
            "loss_avg_model": loss,
            "min_iteration": min(s[2] for s in chosen.values()),
            "max_iteration": max(s[2] for s in chosen.values()),
        }
        if worst.reached_at is None:
            point["worst_worker_at_target"] = worst.check(chosen, point["t_s"])
        curve.append(point)
    return curve, worst.reached_at


class _WorstWorker:
    """Whether every worker's own model is at the target, tick by tick, until one tick says yes."""

    def __init__(self, num_workers: int, score, at_target):
        self.score = score
        self.at_target = at_target
        self.order = list(range(num_workers))  # the last worker to miss goes first
        self.reached_at: float | None = None
        self._verdicts: dict[tuple[int, float], bool] = {}  # (worker, snapshot due): a snapshot is scored once

    def check(self, chosen: dict[int, tuple], t_s: float) -> bool:
        """``chosen``: each worker's snapshot at this tick (those that had joined by then)."""
        for worker in self.order:
            if worker not in chosen:
                continue
            key = (worker, chosen[worker][0])
            if key not in self._verdicts:
                self._verdicts[key] = self.at_target(*self.score(chosen[worker][3]))
            if not self._verdicts[key]:
                self.order.remove(worker)
                self.order.insert(0, worker)
                return False
        self.reached_at = t_s
        return True
