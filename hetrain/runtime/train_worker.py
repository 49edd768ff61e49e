"""One worker of a training run: the loop the CLI runs on every rank.

take a batch -> (emulated) compute -> optimizer step -> protocol.step(), until
the iteration or time budget is spent; then protocol.finish(). Emulation: with
``compute_ms`` T, a worker of slowdown factor f sleeps so that each iteration's
compute lasts T*f ms (the model math still runs); without it, it sleeps
(f - 1) times its measured math time. The sleep comes before the math, so it
also works for DDP, whose backward pass contains the all-reduce.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from hetrain.config import RunConfig
from hetrain.data import ShardSampler, accuracy, build_model, load_dataset
from hetrain.runtime.context import WorkerContext
from hetrain.runtime.protocol import flat_parameters
from hetrain.runtime.registry import build_protocol
from hetrain.slowdown import parse_slowdown

CALIBRATION_ITERATIONS = 5
MAX_SNAPSHOT_PARAMS = 2_000_000  # accuracy-over-time snapshots only for small models
PROGRESS_INTERVAL_S = 0.25


def measure_math_s(model: nn.Module, sampler: ShardSampler, iterations: int = CALIBRATION_ITERATIONS) -> float:
    """Median seconds of one forward+backward on this worker's batches (no step, grads cleared)."""
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for _ in range(iterations + 1):
        x, y = sampler.next()
        began = time.perf_counter()
        loss_fn(model(x), y).backward()
        times.append(time.perf_counter() - began)
    model.zero_grad(set_to_none=True)
    times = sorted(times[1:])
    return times[len(times) // 2]


def train_worker(ctx: WorkerContext, config: RunConfig) -> dict:
    """Run one worker; return its counters, snapshots and final accuracies (picklable)."""
    data = load_dataset(config.workload, config.seed)
    model = build_model(config.workload, config.model_params, config.seed).to(ctx.device)
    sampler = ShardSampler(data, ctx.rank, ctx.world_size, config.batch_size, config.seed)
    slowdown = parse_slowdown(config.slowdown, config.seed).check_workers(ctx.world_size)
    math_s = measure_math_s(model, sampler)
    base_s = config.compute_ms / 1000.0 if config.compute_ms is not None else math_s
    standalone_s = max(base_s * slowdown.expected_factor(ctx.rank), math_s)

    protocol = build_protocol(config, model, ctx)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    loss_fn = nn.CrossEntropyLoss()
    snapshots = []  # (tick, t_s, iteration, flat params)
    take_snapshots = sum(p.numel() for p in model.parameters()) <= MAX_SNAPSHOT_PARAMS

    dist.barrier()
    t0 = time.perf_counter()
    next_tick, last_report = 0, 0.0
    computed = 0
    while True:
        elapsed = time.perf_counter() - t0
        if take_snapshots and elapsed >= next_tick * config.eval_interval_s:
            snapshots.append((next_tick, elapsed, protocol.stats.iteration, flat_parameters(model)))
            next_tick = int(elapsed / config.eval_interval_s) + 1
        if ctx.report is not None and elapsed - last_report >= PROGRESS_INTERVAL_S:
            ctx.report({"iteration": protocol.stats.iteration, "computed": computed, "t_s": elapsed})
            last_report = elapsed
        local_done = (config.iterations is not None and protocol.stats.iteration >= config.iterations) or (
            config.time_budget_s is not None and elapsed >= config.time_budget_s
        )
        if protocol.should_stop(local_done):
            break
        extra_s = base_s * slowdown.factor(ctx.rank, computed) - math_s
        if extra_s > 0:
            time.sleep(extra_s)
        x, y = sampler.next()
        x, y = x.to(ctx.device), y.to(ctx.device)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(protocol.module(x), y).backward()
        optimizer.step()
        computed += 1
        protocol.step()
    loop_s = time.perf_counter() - t0
    local_accuracy = accuracy(model, data.x_test.to(ctx.device), data.y_test.to(ctx.device))
    if take_snapshots:
        snapshots.append((next_tick, loop_s, protocol.stats.iteration, flat_parameters(model)))
    protocol.finish()
    consensus_accuracy = accuracy(model, data.x_test.to(ctx.device), data.y_test.to(ctx.device))
    if ctx.report is not None:
        ctx.report({"iteration": protocol.stats.iteration, "computed": computed, "t_s": loop_s, "done": True})
    worker = protocol.metrics()
    worker.update(rank=ctx.rank, standalone_iteration_s=standalone_s, math_s=math_s, loop_s=loop_s,
                  local_accuracy=local_accuracy, consensus_accuracy=consensus_accuracy)
    # numpy, not tensors: tensors sent through a multiprocessing queue need the sender alive
    return {"worker": worker, "snapshots": [(k, t, it, flat.cpu().numpy()) for k, t, it, flat in snapshots]}
