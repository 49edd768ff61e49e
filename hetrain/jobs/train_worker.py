"""One worker of a training run: the loop the CLI runs on every rank.

take a batch -> (emulated) compute -> optimizer step -> protocol.step(), until
the iteration or time budget is spent (or the launcher asks to stop); then
protocol.finish(). Emulation (:mod:`hetrain.jobs.emulation`): with
``compute_ms`` T, a worker of slowdown factor f sleeps so that each iteration's
compute lasts T*f ms (the model math still runs); without it, it sleeps
(f - 1) times its math time. The sleep comes after the work, timed in the same
iteration; DDP's wait inside backward (the all-reduce) is not counted as work.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from hetrain.config import RunConfig
from hetrain.data import Dataset, build_model, evaluate, load_dataset, loss_fn, make_optimizer, make_sampler
from hetrain.epoch_deal import EpochSampler, StoreClaims
from hetrain.jobs import checkpoint
from hetrain.jobs.capacity import standalone_iteration_s
from hetrain.jobs.context import WorkerContext
from hetrain.jobs.emulation import ComputeEmulator
from hetrain.jobs.meter import WindowMeter, peak_rss_mb, tcp_connections
from hetrain.jobs.phases import PhaseClock
from hetrain.jobs.rate_board import RateBoard
from hetrain.jobs.snapshots import SnapshotKeeper
from hetrain.loggers.protocol_logger import worker_figures
from hetrain.slowdown import parse_slowdown
from hetrain.transport.device_thread import synchronize
from hetrain.transport.job import model_device

CALIBRATION_ITERATIONS = 3  # timed, after one warm-up, unless they take longer than:
CALIBRATION_BUDGET_S = 0.25  # a slow model (the LM on busy cores: 2 s a step) is timed once, after its warm-up
PROGRESS_INTERVAL_S = 0.25


def measure_math_s(model: nn.Module, sampler, device: torch.device | None = None,
                   iterations: int = CALIBRATION_ITERATIONS, budget_s: float = CALIBRATION_BUDGET_S) -> float:
    """Median seconds of one forward+backward on this worker's batches (no step, grads cleared).

    The batches go to ``device`` first (default: the model's), as in training. One warm-up pass, then up to ``iterations``
    timed ones, stopping early once the timed ones add up to ``budget_s``: start-up costs at most 4
    iterations' math, and 2 for a slow model. On a GPU the kernels are waited for (their launch
    returns at once).
    """
    device = device if device is not None else model_device(model)
    times = []
    for index in range(iterations + 1):
        x, y = (t.to(device) for t in sampler.next())
        synchronize(device)
        began = time.perf_counter()
        loss_fn(model(x), y).backward()
        synchronize(device)
        times.append(time.perf_counter() - began)
        if index >= 1 and sum(times[1:]) >= budget_s:
            break
    model.zero_grad(set_to_none=True)
    times = sorted(times[1:])
    return times[len(times) // 2]


def train_worker(ctx: WorkerContext, config: RunConfig, services: dict | None = None,
                 data: Dataset | None = None) -> dict:
    """Run one worker; return its counters, snapshots and final accuracies (picklable).

    ``services``: what the launcher serves the job (``gg_address``: its Group Generator);
    ``data``: the workload's data, loaded once by the launcher (None: load it here, as under torchrun).
    The result's ``phases`` time this worker's start and end (:class:`hetrain.jobs.phases.PhaseClock`).
    """
    clock = PhaseClock(ctx.phases)
    data = data if data is not None else load_dataset(config.workload, config.seed)
    model = build_model(config.workload, config.model_params, config.seed).to(ctx.device)
    def new_sampler():
        return make_sampler(config.workload, data, ctx.rank, ctx.world_size, config.batch_size, config.seed,
                            config.data_split)

    slowdown = parse_slowdown(config.slowdown, config.seed).check_workers(ctx.world_size)
    math_s = measure_math_s(model, new_sampler(), ctx.device)  # its batches are not trained on: not counted
    sampler = None if config.deals_epochs else new_sampler()  # else after the protocol: it needs the store
    base_s = config.compute_ms / 1000.0 if config.compute_ms else None  # 0 or None: real compute

    optimizer = make_optimizer(config.resolved_optimizer(), model.parameters(), config.resolved_lr(),
                               config.momentum)
    # no optimizer hook: the loop calls step() itself, so the emulator's timing of the work
    # (optimizer.step() included) never includes the protocol's waiting
    comm = config.comm_settings()
    on_failure = ctx.on_failure if ctx.continue_on_death else "abort"  # the launcher says what its workers build
    joining = ctx.incarnation > 0  # a replacement: the protocol hands it the model of the running job
    clock.lap("setup_s")
    ctx.enter_phase("connect")
    protocol = config.protocol_spec.build(
        model, None, config.protocol_options(), seed=config.seed, timeout_s=config.timeout_s,
        on_failure=on_failure, dead_workers=ctx.dead_workers if on_failure != "abort" else None,
        comm=comm, **(services or {}))
    if joining:
        protocol._inherit_iteration(ctx.start_iteration)
    clock.lap("connect_s")
    if sampler is None:  # each epoch's batches dealt out over the members (hetrain.epoch_deal)
        sampler = EpochSampler(data.x_train, data.y_train, config.batch_size, config.seed,
                               StoreClaims(protocol.job.store))
    if config.resume and not joining:
        _restore(checkpoint.load_worker(config.checkpoint_dir, ctx.rank), model, optimizer, sampler, protocol)
    checkpoints = checkpoint.CheckpointTimer(config.checkpoint_every_s) if config.checkpoint_dir else None
    state = protocol.state
    snapshots = SnapshotKeeper(config.resolved_eval_interval_s(), state.model_nbytes, start_s=ctx.clock_offset_s)
    host_copy = lambda: state.gather_model().cpu()  # noqa: E731 (snapshots wait on the host, not the GPU)
    meter = WindowMeter()
    emulator = ComputeEmulator()
    rates = RateBoard(protocol.job.store, ctx.rank, ctx.world_size, dead=ctx.dead_workers) \
        if hasattr(sampler, "set_rates") else None
    stop_requested = ctx.stop_requested or (lambda: False)
    leave_requested = ctx.leave_requested or (lambda: False)
    asked_to_leave = left = False

    clock.lap("setup_s")
    if not joining:  # the others are training already
        ctx.start_barrier()
    clock.lap("connect_s")
    protocol.restart_clock()
    t0 = time.perf_counter() - ctx.clock_offset_s  # the job's training clock
    last_report = 0.0
    computed = 0
    while True:
        elapsed = time.perf_counter() - t0
        snapshots.maybe_take(elapsed, protocol.stats.iteration, host_copy)
        if ctx.report is not None and elapsed - last_report >= PROGRESS_INTERVAL_S:
            ctx.report({"iteration": protocol.stats.iteration, "computed": computed, "t_s": elapsed,
                        "figures": worker_figures(protocol)})  # for --log (hetrain.loggers.run_logger)
            last_report = elapsed
        local_done = (config.iterations is not None and protocol.stats.iteration >= config.iterations) or (
            config.time_budget_s is not None and elapsed >= config.time_budget_s
        ) or stop_requested()
        if not local_done and not asked_to_leave and leave_requested() and protocol.membership.can_leave:
            asked_to_leave = True  # SIGTERM to this worker alone: leave between two steps
            if protocol.leave():
                left = True
                break
        if protocol.should_stop(local_done):
            break
        if checkpoints is not None and protocol._checkpoint_due(checkpoints.due()):
            ctx.enter_phase("checkpoint")
            _save(config, ctx.rank, model, optimizer, sampler, protocol)
            checkpoints.mark()
        if rates is not None and (known := rates.note(computed)) is not None:
            sampler.set_rates(known)  # --data-split balanced: the shards in deficit (hetrain.shard_balance)
        emulator.begin()
        x, y = sampler.next()
        x, y = x.to(ctx.device), y.to(ctx.device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(protocol.module(x), y)
        loss.backward()
        synchronize(ctx.device)  # the math's kernels on the compute stream, not their launch (GPU)
        in_backward_wait_s = protocol._backward_wait_s()
        optimizer.step()
        emulator.end(base_s, slowdown.factor(ctx.rank, computed), excluded_s=in_backward_wait_s)
        computed += 1
        if computed == 1:
            clock.mark("first_iteration_at")
        protocol.step()
        meter.record(time.perf_counter() - t0, len(x), float(loss.detach()))
    loop_s = time.perf_counter() - t0
    clock.lap(None)
    x_test, y_test = data.x_test.to(ctx.device), data.y_test.to(ctx.device)
    local_accuracy, local_loss = evaluate(model, x_test, y_test)
    snapshots.take_final(loop_s, protocol.stats.iteration, host_copy)
    connections_training = tcp_connections()  # before the final average over the whole job
    ctx.enter_phase("finish")
    protocol.finish()  # a worker that left: only its release
    if checkpoints is not None and not left:  # the consensus model: a later --resume trains on from it
        _save(config, ctx.rank, model, optimizer, sampler, protocol)
        checkpoints.mark()
    fingerprint = model_fingerprint(state.model_tensors)
    consensus_accuracy = consensus_loss = None
    if not left and ctx.rank == _first_live_rank(ctx):  # the one model finish() left on every worker (see the fingerprint)
        consensus_accuracy, consensus_loss = evaluate(model, x_test, y_test)
    if ctx.report is not None:
        ctx.report({"iteration": protocol.stats.iteration, "computed": computed, "t_s": loop_s, "done": True,
                    "figures": worker_figures(protocol)})
    worker = protocol.metrics()
    ledger = emulator.ledger
    standalone_s = standalone_iteration_s(config, slowdown, ctx.rank, ledger.median_work_s() or math_s,
                                          worker["compute_s"], worker["iterations"],
                                          achieved_s=ledger.mean_achieved_s())
    worker.update(rank=ctx.rank, standalone_iteration_s=standalone_s, math_s=math_s, loop_s=loop_s,
                  compute_phase=ledger.summary(),
                  local_accuracy=local_accuracy, local_loss=local_loss, consensus_accuracy=consensus_accuracy,
                  consensus_loss=consensus_loss, model_fingerprint=fingerprint,
                  tcp_connections_training=connections_training, tcp_connections_end=tcp_connections(),
                  throughput_series=meter.finish(loop_s), checkpoints_saved=checkpoints.saved if checkpoints else 0,
                  incarnation=ctx.incarnation, started_t_s=ctx.clock_offset_s)
    # after the last window's reading (it read a peak below its own series); the result's sending is not in it
    worker["peak_rss_mb"] = round(max([peak_rss_mb()] + [p["rss_mb"] for p in worker["throughput_series"]]), 1)
    if hasattr(sampler, "drawn"):  # --data-split balanced: batches taken from each shard
        worker["batches_by_shard"] = list(sampler.drawn)
    if hasattr(sampler, "record"):  # a job that may grow: the batches it was dealt in each epoch
        worker["epochs_dealt"] = sampler.record()
    if ctx.device.type == "cuda":  # what this worker's tensors held on its GPU at most (scripts/gpu-check)
        worker["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated(ctx.device) / 2**20, 1)
    # numpy, not tensors: tensors sent through a multiprocessing queue need the sender alive
    kept = [(due, t, it, flat.cpu().numpy()) for due, t, it, flat in snapshots.snapshots]
    clock.lap("finish_s")
    worker.update(clock.phases)
    return {"worker": worker, "snapshots": kept}


def _save(config: RunConfig, rank: int, model, optimizer, sampler, protocol) -> None:
    checkpoint.save_worker(config.checkpoint_dir, rank, {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "sampler": sampler.state_dict(),
        "rng": torch.get_rng_state(), "protocol": protocol.state_dict(),
        **({"cuda_rng": torch.cuda.get_rng_state(model_device(model))} if model_device(model).type == "cuda" else {}),
    })


def _restore(state: dict, model, optimizer, sampler, protocol) -> None:
    """Load a worker checkpoint (every worker does this at the same point: PS's resume is a collective).

    Workers that take the same steps (All-Reduce) must hold one model: they all load rank 0's model,
    optimizer and protocol state (each its own sampler's). A worker that died while the others wrote a
    checkpoint left its file of the checkpoint before, and DDP, which broadcasts the model only when it is
    built, kept the replicas apart for the whole resumed run."""
    if protocol._steps_together and protocol.job.world_size > 1:
        shared = [{name: state[name] for name in ("model", "optimizer", "protocol")}]
        torch.distributed.broadcast_object_list(shared, src=0, group=protocol.job.group)
        own = state["protocol"].get("own")  # a worker's own part (PowerSGD's error feedback) stays its own
        state = {**state, **shared[0]}
        state["protocol"] = {k: v for k, v in state["protocol"].items() if k != "own"} | (
            {"own": own} if own is not None else {})
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["rng"])
    if "cuda_rng" in state and model_device(model).type == "cuda":
        torch.cuda.set_rng_state(state["cuda_rng"], model_device(model))
    protocol.load_state_dict(state["protocol"])
    protocol._align_resumed_iteration()


def _first_live_rank(ctx) -> int:
    """The lowest rank not known dead: the one worker that evaluates the final model. Every worker holds
    that model after ``finish()`` (``model_fingerprint`` shows it), and at 25M parameters an evaluation on
    4 workers sharing 2 cores took 8 s of each worker's end (docs/decisions/one-evaluation-of-the-final-model.md)."""
    dead = ctx.dead_workers() if ctx.dead_workers is not None else set()
    return min(set(range(ctx.world_size)) - set(dead), default=ctx.rank)


def model_fingerprint(tensors: list[torch.Tensor]) -> list[float]:
    """(sum, L2 norm) of a model's tensors, accumulated in float64: equal on workers that hold the same
    model, and read tensor by tensor, with no flat copy of the model."""
    total = squares = 0.0
    with torch.no_grad():
        for t in tensors:
            total += float(torch.sum(t, dtype=torch.float64))
            squares += float(torch.linalg.vector_norm(t, dtype=torch.float64)) ** 2
    return [total, squares**0.5]
