"""The trajectory check of ``hetrain plan --train``: real optimizer steps beside the whole model, in float64.

At a few windows of consecutive steps along the run (:func:`check_windows`), every rank's state (its
weight shards, the biases it holds and their momentum buffers) is assembled from all ranks, the copies
of an element held by several ranks measured against each other (:func:`rebuilt`: the replica
disagreement), and the partitioned step rebuilt in float64 from it. Each rank also builds the whole
module in float64 from the same state, with torch's own SGD and the same momentum buffers
(:class:`WholeModel`). The run's next steps are then taken in float64: the partitioned model with the
run's own optimizer, the whole model with its, on the same batches. After each of them every rank
compares its loss, the gradients its optimizer was given and its parameters after the update with the
whole model's (:meth:`WholeModel.follow`), so a wrong update (a frozen shard, another optimizer) or
copies that part ways show after one step, and the window's last step shows where K real steps led.
After the window the run goes back to float32 from its own state.
"""

from __future__ import annotations

import copy
import math

from hetrain.planner.train_step import TrainStep, _worse


def worst(values) -> float:
    """The largest of ``values``; NaN if any is NaN (no agreement), NaN if there are none."""
    values = [float(v) for v in values]
    if not values or any(math.isnan(v) for v in values):
        return math.nan
    return max(values)


def _max_over_ranks(torch, dist, values):
    """Element-wise maximum over all ranks, NaN where any rank has NaN (gloo's maximum may drop it)."""
    nan = torch.isnan(values).to(values.dtype)
    values = torch.nan_to_num(values, nan=0.0)
    both = torch.stack([values, nan])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return torch.where(both[1] > 0, torch.full_like(both[0], math.nan), both[0])


def check_windows(starts, steps: int, length: int) -> tuple:
    """The steps run in float64 beside the whole model: ``length`` consecutive steps from each start
    (moved back so that the window ends by the last step)."""
    length = min(length, steps)
    return tuple(sorted({k for s in starts for k in range(min(s, steps - length), min(s, steps - length) + length)}))


def make_optimizer(torch, params, lr: float, momentum: float):
    """The optimizer of every rank's pieces: SGD with momentum, as ``hetrain train``."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


def rebuilt(torch, step, optimizer, dtype, lr: float, momentum: float):
    """(step, optimizer, state, disagreement): the rank's step and optimizer rebuilt in ``dtype`` from the
    state assembled from every rank; ``state`` = (weights, biases, momentum of weights, of biases) whole;
    ``disagreement``: the largest difference between a rank's copy and the assembled value."""
    params = step.parameters()
    buffers = [optimizer.state.get(p, {}).get("momentum_buffer") for p in params]
    buffers = [torch.zeros_like(p) if b is None else b for b, p in zip(buffers, params)]
    weights, biases, worst_so_far = step.gathered()
    mom_w, mom_b, worst_momentum = step.gathered(buffers)
    new = TrainStep(step.p, step.me, torch, step.dist, dtype, weights, biases)
    new_optimizer = make_optimizer(torch, new.parameters(), lr, momentum)
    for p, b in zip(new.parameters(), new.pieces(mom_w, mom_b)):
        new_optimizer.state[p]["momentum_buffer"] = b.to(dtype).clone()
    return new, new_optimizer, (weights, biases, mom_w, mom_b), _worse(worst_so_far, worst_momentum)


def _swapped(la, w):
    """A weight between the module's (outputs, inputs[, k, k]) order and the executor's (inputs, outputs[, k, k])."""
    return w.t() if la.kind == "linear" else w.permute(1, 0, 2, 3)


class WholeModel:
    """The user's module in float64 from an assembled state, trained by torch's SGD with momentum."""

    def __init__(self, torch, module, net, state, lr: float, momentum: float):
        self.torch, self.net = torch, net
        weights, biases, mom_w, mom_b = state
        self.module = copy.deepcopy(module).double()
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=lr, momentum=momentum)
        with torch.no_grad():
            for la, w, b, mw, mb in zip(net.layers, weights, biases, mom_w, mom_b):
                mod = self.module.get_submodule(la.name)
                mod.weight.copy_(_swapped(la, w))
                self.optimizer.state[mod.weight]["momentum_buffer"] = _swapped(la, mw).double().clone()
                if b is not None:
                    mod.bias.copy_(b)
                    self.optimizer.state[mod.bias]["momentum_buffer"] = mb.double().clone()

    def _layout(self, attr: str):
        weights, biases = [], []
        for la in self.net.layers:
            mod = self.module.get_submodule(la.name)
            weights.append(_swapped(la, getattr(mod.weight, attr)))
            biases.append(None if mod.bias is None else getattr(mod.bias, attr))
        return weights, biases

    def follow(self, k: int, x, y, step, given: list) -> dict:
        """One step of the whole model on the batch ``(x, y)`` the partitioned ``step`` has just taken
        (``given``: the gradients its optimizer was given); the largest differences over all ranks."""
        from hetrain.data import loss_fn

        torch = self.torch
        self.optimizer.zero_grad()
        loss = loss_fn(self.module(x.double()), y)
        loss.backward()
        grads = step.pieces(*self._layout("grad"))
        before = [p.detach().clone() for p in self.module.parameters()]
        self.optimizer.step()
        moved = worst(float((p.detach() - b).abs().max()) for p, b in zip(self.module.parameters(), before))
        params = step.pieces(*self._layout("data"))
        grad_diff = worst([0.0] + [float((g - r).abs().max()) for g, r in zip(given, grads) if g.numel()])
        param_diff = worst([0.0] + [float((p.detach() - r).abs().max()) for p, r in zip(step.parameters(), params)
                                    if p.numel()])
        out = torch.tensor([abs(step.loss - float(loss.detach())), grad_diff, param_diff, moved],
                           dtype=torch.float64)
        out = _max_over_ranks(torch, step.dist, out)
        return {"step": k, "loss_diff": float(out[0]), "grad_diff": float(out[1]), "param_diff": float(out[2]),
                "whole_model_moved": float(out[3])}
