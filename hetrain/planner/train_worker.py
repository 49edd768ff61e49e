"""The processes of ``hetrain plan --train``: a plan's ranks, and DDP's on the same emulated devices.

Both read the same global batches (one seeded sampler over the whole training
set, every rank drawing the same sequence) so that the partitioned model, the
unpartitioned reference and DDP see the same data. Run by
:func:`hetrain.jobs.local_job.run_local` (gloo, one thread per process).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from hetrain.planner.train_check import WholeModel, make_optimizer, rebuilt
from hetrain.planner.train_step import (
    EmulatedClock,
    EmulatedComm,
    TrainStep,
    _pad_until,
    _worse,
    reference_step,
)


@dataclass(frozen=True)
class Emulation:
    """Each rank's device: FLOP/s and link bytes/s, and emulated seconds per device second."""

    flops_per_s: tuple
    link_bytes_per_s: tuple
    scale: float


@dataclass(frozen=True)
class TrainJob:
    """What every process needs: the model (pickled module), its data, the optimizer, the schedule."""

    module: object
    data: object
    batch: int
    steps: int
    check_steps: tuple
    lr: float
    momentum: float
    seed: int
    emulation: Emulation
    report_every: int = 10
    trajectory_steps: tuple = ()  # run in float64 beside the whole model (hetrain.planner.train_check)


def executor_layout(torch, module, net):
    """The module's weights in the executor's (inputs, outputs[, k, k]) order, and its biases."""
    weights, biases = [], []
    for la in net.layers:
        mod = module.get_submodule(la.name)
        w = mod.weight.detach()
        weights.append(w.t().contiguous() if la.kind == "linear" else w.permute(1, 0, 2, 3).contiguous())
        biases.append(None if mod.bias is None else mod.bias.detach().clone())
    return weights, biases


def load_into(torch, module, net, weights, biases) -> None:
    """Write executor-layout tensors back into the module's parameters."""
    with torch.no_grad():
        for la, w, b in zip(net.layers, weights, biases):
            mod = module.get_submodule(la.name)
            mod.weight.copy_(w.t() if la.kind == "linear" else w.permute(1, 0, 2, 3))
            if b is not None:
                mod.bias.copy_(b)


def _sampler(job):
    from hetrain.data import ShardSampler

    return ShardSampler(job.data, 0, 1, job.batch, job.seed)


def plan_worker(ctx, job: TrainJob, program) -> dict:
    """One device of the plan: ``job.steps`` partitioned steps on its shards, checks at ``check_steps``."""
    import torch
    import torch.distributed as dist

    from hetrain.data import evaluate

    torch.manual_seed(job.seed)
    net, emu, me = program.net, job.emulation, ctx.rank
    weights, biases = executor_layout(torch, job.module, net)
    step = TrainStep(program, me, torch, dist, torch.float32, weights, biases)
    optimizer = make_optimizer(torch, step.parameters(), job.lr, job.momentum)
    levels = max((len(path) for path in program.layout.paths), default=1)
    sampler, pool, whole, disagreement = _sampler(job), {}, None, 0.0
    step_s, compute_s, level_s, losses, checks, level_bytes, trajectory = [], [], [], [], [], [], []
    for k in range(job.steps):
        x, y = sampler.next()
        if k in job.check_steps:
            checks.append(_check(torch, dist, step, program, job, x, y, k))
        if k in job.trajectory_steps and whole is None:
            step, optimizer, state, worst = rebuilt(torch, step, optimizer, torch.float64, job.lr, job.momentum)
            whole = WholeModel(torch, job.module, net, state, job.lr, job.momentum)
            disagreement = _worse(disagreement, worst)
        step.set_batch(x, y)
        comm = EmulatedComm(torch, dist, me, step.dtype, levels, program.layout.paths, emu.link_bytes_per_s,
                            emu.scale, pool)
        clock = EmulatedClock(emu.flops_per_s[me], emu.scale)
        start = time.perf_counter()
        _, grads = step.run(comm, clock)
        given = step.gradients(grads)
        for param, grad in zip(step.parameters(), given):
            param.grad = grad
        optimizer.step()
        step_s.append(time.perf_counter() - start)
        compute_s.append(clock.seconds)
        level_s.append(comm.seconds)
        level_bytes.append([b * 4 // comm.elem_bytes for b in comm.bytes])  # as float32, the plan's element
        losses.append(step.loss)
        if whole is not None:
            trajectory.append(whole.follow(k, x, y, step, given))
            if k + 1 not in job.trajectory_steps:
                step, optimizer, _, worst = rebuilt(torch, step, optimizer, torch.float32, job.lr, job.momentum)
                whole, disagreement = None, _worse(disagreement, worst)
        if me == 0 and (k + 1) % job.report_every == 0:
            ctx.report(("step", k + 1, step.loss))
    weights, biases, worst = step.gathered()
    result = {"rank": me, "losses": losses, "checks": checks, "trajectory": trajectory,
              "replica_disagreement": _worse(disagreement, worst),
              "step_s": statistics.median(_timed(step_s, job)), "compute_s": statistics.median(_timed(compute_s, job)),
              "level_s": [statistics.median(_timed([s[j] for s in level_s], job)) for j in range(levels)],
              "level_bytes": level_bytes[-1]}
    if me == 0:
        load_into(torch, job.module, net, weights, biases)
        accuracy, test_loss = evaluate(job.module, job.data.x_test, job.data.y_test)
        result.update(accuracy=accuracy, test_loss=test_loss)
    return result


def _timed(values, job):
    """The steps that count for timing: not the first (warm-up) and not those that ran a check or float64."""
    kept = [v for k, v in enumerate(values) if k and k not in job.check_steps and k not in job.trajectory_steps]
    return kept or values


def _check(torch, dist, step, program, job, x, y, k) -> dict:
    """At step ``k``: the partitioned step in float64 from the gathered state against the unpartitioned
    step of the re-created network and against the module itself, on the same batch."""
    weights, biases, _ = step.gathered()
    w64 = [w.double() for w in weights]
    b64 = [None if b is None else b.double() for b in biases]
    exact = TrainStep(program, step.me, torch, dist, torch.float64, w64, b64)
    exact.set_batch(x, y)
    levels = max((len(path) for path in program.layout.paths), default=1)
    from hetrain.planner.execute import _Clock, _Comm, gradient_error

    _, grads = exact.run(_Comm(torch, dist, step.me, torch.float64, levels), _Clock())
    ref_loss, ref_w, ref_b = reference_step(program, torch, w64, b64, exact.x, y)
    grad_diff, grad_scale = gradient_error(grads, ref_w)
    for i, g in exact.bias_grads.items():
        box = exact.bias_boxes[i][step.me]
        grad_diff = max(grad_diff, float((g - ref_b[i][box[2]:box[3]]).abs().max()))
    module = _module64(torch, job.module, program.net, w64, b64)
    from hetrain.data import loss_fn

    with torch.no_grad():
        module_loss = float(loss_fn(module(x.double()), y))
    out = torch.tensor([abs(exact.loss - ref_loss), grad_diff, grad_scale, abs(module_loss - ref_loss)],
                       dtype=torch.float64)
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return {"step": k, "loss": ref_loss, "loss_diff": float(out[0]), "grad_diff": float(out[1]),
            "grad_scale": float(out[2]), "module_loss_diff": float(out[3])}


def _module64(torch, module, net, weights, biases):
    import copy

    m = copy.deepcopy(module).double()
    load_into(torch, m, net, weights, biases)
    return m


def ddp_worker(ctx, job: TrainJob, splits: list, grad_bytes: float, steps: int) -> dict:
    """Data parallelism with torch's own DistributedDataParallel on the same emulated devices, once per split.

    ``splits``: (shares, flops) each: rank r takes samples ``shares[r]`` of each global batch, its forward
    and backward padded to ``flops[r]`` at its device's FLOP/s, the gradient all-reduce (a comm hook:
    sum, since each rank's loss is its samples' share of the global mean) padded to a ring all-reduce of
    ``grad_bytes`` at the slowest link: 2 (W-1)/W bytes over it. Every split starts from the job's model.
    Returns the rank's median step per split.
    """
    return {"rank": ctx.rank, "step_s": [_ddp_run(ctx, job, shares, flops, grad_bytes, steps)
                                         for shares, flops in splits]}


def _ddp_run(ctx, job: TrainJob, shares: list, flops: list, grad_bytes: float, steps: int) -> float:
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    emu, me, world = job.emulation, ctx.rank, ctx.world_size
    model = DistributedDataParallel(copy.deepcopy(job.module))
    clock = {"start": 0.0, "padded": False}
    compute_s = flops[me] / emu.flops_per_s[me] * emu.scale
    ring_s = 2 * (world - 1) / world * grad_bytes / min(emu.link_bytes_per_s) * emu.scale

    def hook(state, bucket):
        if not clock["padded"]:
            _pad_until(clock["start"] + compute_s)
            clock["padded"] = True
        begun = time.perf_counter()
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()

        def done(f):
            _pad_until(begun + ring_s)
            return f.value()[0]

        return fut.then(done)

    model.register_comm_hook(None, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=job.lr, momentum=job.momentum)
    sampler = _sampler(job)
    b0, b1 = shares[me]
    times = []
    for _ in range(steps + 1):  # the first is a warm-up
        x, y = sampler.next()
        clock["start"], clock["padded"] = time.perf_counter(), False
        loss = F.cross_entropy(model(x[b0:b1]), y[b0:b1], reduction="sum") / job.batch
        loss.backward()
        if not clock["padded"]:
            _pad_until(clock["start"] + compute_s)
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - clock["start"])
    return statistics.median(times[1:])
