"""A plan applied to your own model, under torchrun: :func:`parallelize`.

::

    # torchrun --nproc-per-node 4 train.py
    import torch, torch.distributed as dist
    from hetrain.planner import parallelize, plan_model

    dist.init_process_group("gloo")
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    plan = plan_model(model, 64, "tpu-v3:2,tpu-v2:2", input_shape=(64,), dtype_bytes=4).plans["plan"]
    planned = parallelize(model, plan, sample_shape=(64,), batch=64)
    opt = torch.optim.SGD(planned.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:                 # the same global batch on every rank
        loss = planned.train_step(x, y)  # forward, backward, the plan's exchanges; sets .grad
        opt.step()
    trained = planned.gathered_module()  # every rank: the whole model, assembled from the shards

Rank ``r`` of the default process group is device ``r`` of the plan (the order
of the devices given to the planner). Each rank holds only its shards of every
weight (its ``parameters()``), computes only its boxes and moves what the plan
says must move (:mod:`hetrain.planner.execute`); the loss is cross-entropy
over the module's output. The module must be what the executor re-creates
from the layer table (Linear/Conv2d layers, a ReLU after a layer unless it
feeds a residual addition, flattening, average pooling to a head's grid): a
module that differs is refused at :func:`parallelize` after one check step.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from hetrain.errors import UsageError
from hetrain.planner.execute import _Clock, _Comm
from hetrain.planner.program import Program
from hetrain.planner.trace import trace
from hetrain.planner.train_step import TrainStep, reference_step
from hetrain.planner.train_worker import executor_layout, load_into

MATCH_TOLERANCE = 1e-6


class PlannedModel(nn.Module):
    """One rank's part of a model partitioned by a plan (see the module docstring)."""

    def __init__(self, module: nn.Module, program: Program, rank: int):
        super().__init__()
        self.program, self.rank = program, rank
        weights, biases = executor_layout(torch, module, program.net)
        # the whole model's structure only (on the meta device: no memory), filled by gathered_module()
        object.__setattr__(self, "_template", copy.deepcopy(module).to("meta"))
        self.step = TrainStep(program, rank, torch, dist, torch.float32, weights, biases)
        self.shards = nn.ParameterList([nn.Parameter(s) for s in self.step.shards])
        self.step.shards = list(self.shards)
        held = sorted(self.step.biases)
        self.biases = nn.ParameterList([nn.Parameter(self.step.biases[i]) for i in held])
        self.step.biases = dict(zip(held, self.biases))
        self._levels = max((len(path) for path in program.layout.paths), default=1)
        self._pool: dict = {}

    def parameters(self, recurse: bool = True):
        """This rank's shards and the biases it holds (what its optimizer updates)."""
        return iter(self.step.parameters())

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Forward and backward of the global batch ``x``, ``y`` (the same on every rank); sets ``.grad``
        of :meth:`parameters` to the complete gradients of the mean cross-entropy; returns the loss."""
        if x.shape[0] != self.program.batch:
            raise UsageError(f"parallelize: the plan was made for batch {self.program.batch}, this batch has "
                             f"{x.shape[0]} samples; plan for the batch you train with (or drop the last one)")
        self.step.set_batch(x, y)
        comm = _Comm(torch, dist, self.rank, torch.float32, self._levels, pool=self._pool)
        _, grads = self.step.run(comm, _Clock())
        for param, grad in zip(self.step.parameters(), self.step.gradients(grads)):
            param.grad = grad
        return self.step.loss

    def gathered_module(self) -> nn.Module:
        """The whole model with the trained weights (a collective: every rank calls it)."""
        with torch.no_grad():
            weights, biases, _ = self.step.gathered()
        module = copy.deepcopy(self._template).to_empty(device="cpu")
        load_into(torch, module, self.program.net, weights, biases)
        return module


def parallelize(module: nn.Module, plan, sample_shape, batch: int, check: bool = True) -> PlannedModel:
    """``module`` partitioned by ``plan`` (a :class:`~hetrain.planner.hierarchy.GroupPlan`, e.g.
    ``plan_model(...).plans["plan"]``) over the ranks of the initialised default process group.

    ``check``: run one float64 step on a seeded batch and refuse (one line) a module whose output is not
    the function the executor re-creates from its layer table, or a plan that does not sum up.
    """
    if not dist.is_initialized():
        raise UsageError("parallelize: no process group; run under torchrun and call "
                         "torch.distributed.init_process_group first")
    world, rank = dist.get_world_size(), dist.get_rank()
    if plan.num_devices != world:
        raise UsageError(f"parallelize: the plan is for {plan.num_devices} devices and {world} processes run; "
                         f"start torchrun with --nproc-per-node {plan.num_devices} (or plan for {world})")
    net = trace(module, tuple(sample_shape), type(module).__name__)
    program = Program(net, batch, plan)
    if check:
        _check(module, program, rank, tuple(sample_shape))
    return PlannedModel(module, program, rank)


def _check(module, program, rank, sample_shape) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((program.batch, *sample_shape), generator=gen, dtype=torch.float64)
    classes = program.net.layers[-1].d_out
    y = torch.randint(0, classes, (program.batch,), generator=gen)
    weights, biases = executor_layout(torch, module, program.net)
    w64 = [w.double() for w in weights]
    b64 = [None if b is None else b.double() for b in biases]
    step = TrainStep(program, rank, torch, dist, torch.float64, w64, b64)
    step.set_batch(x, y)
    levels = max((len(path) for path in program.layout.paths), default=1)
    step.run(_Comm(torch, dist, rank, torch.float64, levels), _Clock())
    ref_loss, _, _ = reference_step(program, torch, w64, b64, step.x, y)
    with torch.no_grad():
        logits = copy.deepcopy(module).double()(x)
    module_loss = float(nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y))
    if abs(module_loss - ref_loss) > MATCH_TOLERANCE * max(1.0, abs(ref_loss)):
        raise UsageError(f"parallelize: {type(module).__name__} is not the network the executor re-creates from "
                         f"its layers (loss {module_loss:.6f} against {ref_loss:.6f}); use Linear/Conv2d layers "
                         "with a ReLU after each one except the last and those feeding a residual addition")
    if abs(step.loss - ref_loss) > MATCH_TOLERANCE * max(1.0, abs(ref_loss)):
        raise UsageError(f"parallelize: the partitioned step's loss {step.loss:.6f} differs from the whole "
                         f"model's {ref_loss:.6f}; the plan does not fit this model")
