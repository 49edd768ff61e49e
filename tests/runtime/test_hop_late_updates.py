"""With ``late_updates="progress"`` Hop puts back the steps an old update would undo
(:mod:`hetrain.protocols.lag_compensation`; docs/decisions/hop-late-updates-progress.md).

A constant gradient (loss ``-sum(w)``, SGD lr 1, no momentum) moves every model by exactly 1 a step, so
a worker's model minus its own steps is what mixing made of the workers' different starts (0, 10, 20,
30). Worker 0 is slower, so with backup 1 and staleness 1 its ring neighbours mix its updates late and
stale. With the steps put back, the workers' starts are averaged and their steps kept; averaged as old
models (Hop's rule, the default ``"model"``), every old update pulls a worker back by its lag: the models
end far below their steps plus the lowest start.
"""

import time

import pytest
import torch
from torch import nn

import hetrain
from hetrain.jobs.local_job import run_local

STEPS, SIZE = 80, 4


class Progress(nn.Module):
    def __init__(self, start: float):
        super().__init__()
        self.w = nn.Parameter(torch.full((SIZE,), start, dtype=torch.float64))


def _constant_progress(ctx, late_updates):
    model = Progress(10.0 * ctx.rank)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sync = hetrain.Hop(model, opt, topology="ring", backup=1, staleness=1, skip_threshold=0, max_ig=4,
                       late_updates=late_updates)
    for _ in range(STEPS):
        opt.zero_grad()
        (-model.w.sum()).backward()
        opt.step()
        if ctx.rank == 0:
            time.sleep(0.02)  # the slow worker: its neighbours use its updates late
    mixed_starts = (model.w.detach() - STEPS).tolist()  # the model less its own steps, before the final average
    progress = sync._progress  # P: its own steps since its first send, one a step (none kept with "model")
    own_steps = progress._total.tolist() if progress is not None else None
    metrics = sync.metrics()
    sync.finish()
    return mixed_starts, metrics["updates_stale"], (metrics["updates_lag_compensated"],
                                                    metrics["updates_lag_uncompensated"]), own_steps


@pytest.mark.timeout(90)
def test_old_updates_have_their_lost_steps_put_back(processes):
    results = run_local(_constant_progress, 4, ("progress",), timeout_s=30)
    old_terms = sum(old for _, old, _, _ in results)
    assert old_terms >= 20, f"too few old updates used ({old_terms}) for the test to mean anything"
    mixed = torch.tensor([m for m, _, _, _ in results])
    # every model is its steps plus a mix of the starts (0..30): no step lost to an old update
    assert mixed.min() >= -0.5 and mixed.max() <= 30.5, mixed[:, 0]
    # and the starts were mixed (with no communication each worker keeps its own: spread 11.2 per coordinate)
    assert float(mixed[:, 0].std(unbiased=False)) <= 4.0, mixed[:, 0]
    # each old update had its lost steps put back: the worker still held its progress of that iteration
    assert all(counts == (old, 0) for _, old, counts, _ in results), [r[1:3] for r in results]
    # P counts the worker's own steps only, not the mixing's moves (with them it is the dropped rule,
    # the disagreement at k', which diverged in the simulator): STEPS - 1 since the first send
    for _, _, _, own_steps in results:
        assert own_steps == pytest.approx([STEPS - 1.0] * SIZE, abs=1e-9), own_steps


@pytest.mark.timeout(90)
def test_by_default_old_updates_are_mixed_as_the_models_they_are(processes):
    """Hop's own rule stays the default: the same job loses steps to its old updates."""
    results = run_local(_constant_progress, 4, ("model",), timeout_s=30)
    mixed = torch.tensor([m for m, _, _, _ in results])
    assert mixed.max() < -5.0, mixed[:, 0]  # measured -17 to -20: about 35 of 80 steps lost
    assert all(counts == (0, 0) and steps is None for _, _, counts, steps in results)  # no progress kept, none put back


def _weights_loaded_midway(ctx):
    model = Progress(10.0 * ctx.rank)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sync = hetrain.Hop(model, opt, topology="ring", staleness=1, late_updates="progress")
    for step in range(20):
        opt.zero_grad()
        (-model.w.sum()).backward()
        opt.step()
        if step == 6:  # weights from elsewhere (a checkpoint, another model): not this worker's steps
            model.load_state_dict({"w": model.w.detach() + 1000.0})
        if step == 13:  # changed in place, then said so
            with torch.no_grad():
                model.w.add_(-500.0)
            sync.reanchor()
    own_steps = sync._progress._total.tolist()
    sync.finish()
    return own_steps


@pytest.mark.timeout(60)
def test_weights_loaded_midway_are_not_counted_as_steps(processes):
    """P measures the worker's own steps only: weights loaded by ``model.load_state_dict`` or changed and
    followed by ``sync.reanchor()`` would otherwise be put back at every later old update."""
    for own_steps in run_local(_weights_loaded_midway, 2, timeout_s=30):
        assert own_steps == pytest.approx([19.0] * SIZE, abs=1e-9), own_steps
