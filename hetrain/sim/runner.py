"""One simulated run: a RunConfig in, a metrics.json record (the same fields as ``hetrain train``) out."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from hetrain.config import RunConfig
from hetrain.errors import UsageError
from hetrain.metrics import build_metrics
from hetrain.protocols.options import OptionError
from hetrain.sim.common import SimSetup, SimulationError
from hetrain.sim.engine import Engine
from hetrain.sim.math_model import DIGITS_PARAMS, DigitsMath, NullMath
from hetrain.sim.network import Network, NetworkParams
from hetrain.slowdown import parse_slowdown

DEFAULT_COMPUTE_MS = 50.0
MATH_MODES = ("none", "digits")
UNBOUNDED = 1 << 62  # iterations per worker when only a time budget stops the run


@dataclass(frozen=True)
class SimOptions:
    """Simulator-only settings (the rest is the shared RunConfig)."""

    network: NetworkParams = NetworkParams()
    math: str = "none"
    timelines: bool = False
    progress: bool = False
    trace: bool = False


def model_params_for(config: RunConfig, math: str, given: int | None) -> int:
    """Parameters per model message: the digits MLP unless the synthetic workload or --model-params says."""
    if math == "digits":
        if given is not None and given != DIGITS_PARAMS:
            raise OptionError(f"{{math}} digits trains the {DIGITS_PARAMS}-parameter digits MLP; drop {{model_params}}")
        return DIGITS_PARAMS
    if given is not None:
        return given
    return config.model_params if config.workload == "synthetic" else DIGITS_PARAMS


def refuse_unmodelled(config: RunConfig) -> None:
    """One-line errors for settings the simulator would otherwise ignore silently (it models the digits
    MLP's or the synthetic model's messages, and with ``--math digits`` plain SGD on the digits MLP)."""
    if config.workload in ("cnn", "lm"):
        raise OptionError(f"the simulator does not model {{workload}} {config.workload} (its messages are the "
                          "digits MLP's or the synthetic model's); use {workload} synthetic {model_params} P for "
                          "its message size, or measure it with hetrain train")
    if config.optimizer not in (None, "sgd"):
        raise OptionError(f"the simulator's model math is plain SGD; {{optimizer}} {config.optimizer} is not "
                          "modelled (measure it with hetrain train)")
    if config.target_loss is not None:
        raise OptionError("the simulator reports accuracy, not validation loss; {target_loss} applies to "
                          "hetrain train's lm workload (use {target_accuracy})")
    comm = config.comm_settings()
    if comm.outer_named != "none":
        raise OptionError("the simulator does not model an {outer_optimizer} (its math averages models); "
                          "measure it with hetrain train")
    from hetrain.faults import parse_fail

    unmodelled = parse_fail(config.fail, config.seed).unmodelled()
    if unmodelled:
        raise OptionError(f"the simulator models deaths on the training clock only (W@Ts, random:rate=R); "
                          f"{{fail}} {unmodelled[0].describe()} (a start-up or phase death, wall clock, or SIGSTOP) "
                          "is not modelled: run it with hetrain train")


def _progress_bar(total: int, enabled: bool, desc: str):
    if not enabled:
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="grad", file=sys.stderr, mininterval=0.5, leave=False)
    return bar, bar.update


def simulate(config: RunConfig, options: SimOptions = SimOptions(), model_params: int | None = None) -> dict:
    """Simulate ``config`` and return its metrics record.

    The run stops when every worker's iteration counter reaches ``config.iterations``
    or, with ``config.time_budget_s``, at that simulated time (whichever comes first).

    Raises UsageError for bad input. The record has ``wall_time_s`` in simulated
    seconds, ``simulated: true`` and the engine's event count; ``record["timeline"]``
    (popped by the CLI into its own file) holds per-worker compute intervals when
    ``options.timelines`` is set.
    """
    config = config.validate()
    refuse_unmodelled(config)
    if config.on_failure == "respawn":
        raise OptionError("the simulator models {on_failure} abort and continue; respawn (a replacement "
                          "process joining) is measured by real runs: hetrain train")
    if options.math not in MATH_MODES:
        raise OptionError(f"unknown {{math}} {options.math!r}; choose one of {', '.join(MATH_MODES)}")
    if options.network.latency_us < 0 or options.network.bandwidth_gbps <= 0:
        raise OptionError("{latency_us} must be >= 0 and {bandwidth_gbps} > 0")
    if (options.network.collective_step_us or 0.0) < 0:
        raise OptionError(f"{{collective_step_us}} must be >= 0, got {options.network.collective_step_us:g}")
    n = config.num_workers
    slowdown = parse_slowdown(config.slowdown, config.seed).check_workers(n)
    compute_ms = DEFAULT_COMPUTE_MS if config.compute_ms is None else config.compute_ms
    if compute_ms <= 0 and config.iterations is None:
        raise OptionError("a {time_budget_s} run needs {compute_ms} > 0 (zero-time iterations never end)")
    params = model_params_for(config, options.math, model_params)
    comm = config.comm_settings()
    if options.math == "digits" and (comm.compression.enabled or (config.protocol == "ps" and comm.sync_every > 1)):
        raise OptionError("{math} digits models plain averaging of local steps (not compression, nor the "
                          "parameter server's local steps); simulate their time and bytes with {math} none")
    local_steps = _local_steps(config, slowdown, compute_ms)
    exchanges = None if config.iterations is None else -(-config.iterations // comm.sync_every)
    iterations = exchanges if exchanges is not None else UNBOUNDED
    expected_iterations = min(iterations, int(config.time_budget_s / (compute_ms / 1000.0)) + 1
                              if config.time_budget_s else iterations)
    total = n * expected_iterations
    if options.math == "digits":
        math = DigitsMath(n, batch_size=config.batch_size, lr=config.resolved_lr(), seed=config.seed, total_iterations=total,
                          target_accuracy=config.target_accuracy)
    else:
        math = NullMath()
    engine = Engine(trace=options.trace)
    kills = _kills(config, compute_ms, slowdown)
    budget_s, aborted_at_s = config.time_budget_s, None
    if kills and config.resolved_on_failure() == "abort":  # the first death ends the job
        aborted_at_s = kills[0][0]
        budget_s, kills = min(budget_s or aborted_at_s, aborted_at_s), ()
    # the Group Generators' endpoints (prague, adpsgd: one per shard); unused by the others
    extra_endpoints = config.protocol_options().scheduler_endpoints()
    bar, update = _progress_bar(total, options.progress, f"simulate {config.protocol} x{n}")
    setup = SimSetup(n, iterations, compute_ms / 1000.0, slowdown, 4.0 * params, engine,
                     Network(options.network, n + extra_endpoints, comm.link), math, config.seed, budget_s,
                     options.timelines, update, kills, local_steps=local_steps,
                     message_bytes=comm.compression.payload_nbytes(params))
    started = time.perf_counter()
    try:
        result = _protocol_sim(config, setup).run()
    except SimulationError as exc:
        raise UsageError(f"{config.protocol} cannot finish on these settings: {exc}") from None
    finally:
        if bar is not None:
            bar.close()
    runtime_s = time.perf_counter() - started
    accuracy = math.final()
    extra = {
        "simulated": True,
        "slowdown": config.slowdown,
        "compute_ms": compute_ms,
        "model_params": params,
        "batch_size": config.batch_size,
        "iterations_per_worker": config.iterations,
        "time_budget_s": config.time_budget_s,
        "math": options.math,
        "network": options.network.as_dict(),
        **comm.as_dict(),
        "local_steps": local_steps,
        "engine_events": engine.events,
        "messages": setup.network.messages,
        "sim_runtime_s": runtime_s,
        "events_per_s": engine.events / runtime_s if runtime_s > 0 else None,
    }
    extra.update(result.get("extra", {}))
    if aborted_at_s is not None:
        extra.update(aborted_at_s=aborted_at_s, workers_lost=1)
    record = build_metrics(
        protocol=config.protocol,
        workers=result["workers"],
        wall_time_s=result["wall_time_s"],
        batch_size=config.batch_size,
        standalone_iteration_s=[compute_ms / 1000.0 * slowdown.expected_factor(i, expected_iterations)
                                for i in range(n)],
        accuracy_curve=accuracy["accuracy_curve"],
        target_accuracy=config.target_accuracy,
        final_accuracy_avg_model=accuracy["final_accuracy_avg_model"],
        final_accuracy_worst_worker=accuracy["final_accuracy_worst_worker"],
        consensus_distance=accuracy["consensus_distance"],
        time_to_target_worst_worker_s=accuracy["time_to_target_worst_worker_s"],
        efficiency_basis="simulated",
        extra=extra,
    )
    if options.timelines:
        record["timeline"] = result.get("timeline")
    if options.trace:
        record["trace"] = engine.trace
    return record


def _local_steps(config: RunConfig, slowdown, compute_ms: float) -> list[int]:
    """Each worker's local steps per exchange: ``sync_every``, or (``local_work`` auto) sized to its expected
    speed as the runtime sizes it to its measured one."""
    from hetrain.comm.local_work import steps_per_exchange

    comm, n = config.comm_settings(), config.num_workers
    if comm.local_work != "auto":
        return [comm.sync_every] * n
    step_s = [compute_ms * slowdown.expected_factor(i) for i in range(n)]
    return [steps_per_exchange(comm.sync_every, s, min(step_s)) for s in step_s]


def _kills(config: RunConfig, compute_ms: float, slowdown) -> tuple:
    """``--fail``'s (time_s, worker) kills, up to the run's horizon."""
    from hetrain.faults import parse_fail

    spec = parse_fail(config.fail, config.seed)
    if not spec.active:
        return ()
    horizon = config.time_budget_s
    if horizon is None:  # an iteration-limited run: at most every iteration at the slowest worker's pace
        slowest = max(slowdown.expected_factor(i) for i in range(config.num_workers))
        horizon = 10.0 * config.iterations * compute_ms / 1000.0 * slowest
    return tuple(spec.kills(config.num_workers, horizon))


def _protocol_sim(config: RunConfig, setup: SimSetup):
    """The registry's simulated shell for ``config.protocol``, driving the same pure logic as the runtime."""
    return config.protocol_spec.simulator_factory()(setup, config.protocol_options(), config.seed)
