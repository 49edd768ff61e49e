"""One simulated run: a RunConfig in, a metrics.json record (the same fields as ``hetrain train``) out."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from math import isfinite

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
    # (after the fields above: callers pass network, math and timelines by position)
    # the model math's SGD momentum (0: the plain SGD the simulator has always modelled; the advisor passes
    # the job's --momentum so that a predicted time to target follows the optimizer the real run uses)
    math_momentum: float = 0.0
    math_eval_points: int = 20  # accuracy-curve points over the run's expected gradients (the model math only)
    math_stop_at_target: bool = False  # end the run when the averaged model first reaches the target accuracy


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
    if config.elastic or config.join != "none":
        raise OptionError("the simulator does not model workers joining a running job ({max_workers}, {join}): "
                          "run it with hetrain train")
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


@dataclass(frozen=True)
class _Plan:
    """What a run is built from, every input checked (:func:`check_run`)."""

    config: RunConfig
    slowdown: object
    compute_ms: float
    params: int
    protocol_options: object


def check_network(network: NetworkParams) -> None:
    """One-line errors for link settings that are negative, NaN or infinite (a NaN latency never ends a run)."""
    checks = (("latency_us", network.latency_us, ">= 0", lambda v: v >= 0),
              ("bandwidth_gbps", network.bandwidth_gbps, "> 0", lambda v: v > 0),
              ("gg_service_us", network.gg_service_us, ">= 0", lambda v: v >= 0),
              ("collective_step_us", network.collective_step_us, ">= 0", lambda v: v >= 0),
              ("new_group_ms", network.new_group_ms, ">= 0", lambda v: v >= 0))
    for name, value, bound, ok in checks:
        if value is None and name == "collective_step_us":
            continue
        if not isinstance(value, (int, float)) or not isfinite(value) or not ok(value):
            raise OptionError(f"{{{name}}} must be a finite number {bound}, got {value!r:.40}")


def check_run(config: RunConfig, options: SimOptions = SimOptions(), model_params: int | None = None) -> _Plan:
    """Every check :func:`simulate` makes before it starts (UsageError on bad input); nothing runs.

    A sweep calls it for every (protocol, workers) before writing anything."""
    config = config.validate()
    refuse_unmodelled(config)
    if config.on_failure == "respawn":
        raise OptionError("the simulator models {on_failure} abort and continue; respawn (a replacement "
                          "process joining) is measured by real runs: hetrain train")
    if options.math not in MATH_MODES:
        raise OptionError(f"unknown {{math}} {options.math!r}; choose one of {', '.join(MATH_MODES)}")
    check_network(options.network)
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
    if options.math == "digits" and comm.local_work == "auto" and config.protocol in ("prague", "adpsgd"):
        raise OptionError(f"{{math}} digits averages {config.protocol}'s groups unweighted, and {{local_work}} "
                          "auto weights them by local steps: simulate it with {math} none, or use "
                          "{local_work} fixed")
    protocol_options = config.protocol_options()
    if protocol_options.caches_member_sets:  # the cache the runtime fits to --comm-memory-mb (hetrain.jobs.run)
        protocol_options = protocol_options.fit_memory(int(4 * params), compressed=comm.compression.enabled,
                                                       nccl=config.resolved_backend() == "nccl", num_workers=n)
    return _Plan(config, slowdown, compute_ms, params, protocol_options)


def simulate(config: RunConfig, options: SimOptions = SimOptions(), model_params: int | None = None) -> dict:
    """Simulate ``config`` and return its metrics record.

    The run stops when every worker's iteration counter reaches ``config.iterations``
    or, with ``config.time_budget_s``, at that simulated time (whichever comes first).

    Raises UsageError for bad input. The record has ``wall_time_s`` in simulated
    seconds, ``simulated: true`` and the engine's event count; ``record["timeline"]``
    (popped by the CLI into its own file) holds per-worker compute intervals when
    ``options.timelines`` is set.
    """
    plan = check_run(config, options, model_params)
    config, slowdown, compute_ms, params = plan.config, plan.slowdown, plan.compute_ms, plan.params
    n = config.num_workers
    comm = config.comm_settings()
    local_steps = _local_steps(config, slowdown, compute_ms)
    exchanges = None if config.iterations is None else -(-config.iterations // comm.sync_every)
    iterations = exchanges if exchanges is not None else UNBOUNDED
    # local steps each worker is expected to compute (what the progress bar and the accuracy curve count)
    step_limit = UNBOUNDED if exchanges is None else exchanges * comm.sync_every
    expected_steps = min(step_limit, int(config.time_budget_s / (compute_ms / 1000.0)) + 1
                         if config.time_budget_s else step_limit)
    total = n * expected_steps
    if options.math == "digits":
        math = DigitsMath(n, batch_size=config.batch_size, lr=config.resolved_lr(), seed=config.seed, total_iterations=total,
                          target_accuracy=config.target_accuracy, momentum=options.math_momentum,
                          eval_points=options.math_eval_points)
    else:
        math = NullMath()
    engine = Engine(trace=options.trace)
    if options.math_stop_at_target and options.math == "digits":
        math.on_target = engine.stop
    kills = _kills(config, compute_ms, slowdown)
    budget_s, abort_s = config.time_budget_s, None
    if kills and config.resolved_on_failure() == "abort":  # the first death ends the job
        abort_s = kills[0][0]
        if budget_s is not None and budget_s < abort_s:
            abort_s = None  # the budget ends the run first: the kill never happens
        else:
            budget_s = abort_s
        kills = ()
    # the Group Generators' endpoints (prague, adpsgd: one per shard); unused by the others
    extra_endpoints = plan.protocol_options.scheduler_endpoints()
    bar, update = _progress_bar(total, options.progress, f"simulate {config.protocol} x{n}")
    setup = SimSetup(n, iterations, compute_ms / 1000.0, slowdown, 4.0 * params, engine,
                     Network(options.network, n + extra_endpoints, comm.link), math, config.seed, budget_s,
                     options.timelines, update, kills, local_steps=local_steps,
                     message_bytes=comm.compression.payload_nbytes(params),
                     exchange_limits=None if exchanges is None else [-(-config.iterations // h) for h in local_steps])
    started = time.perf_counter()
    try:
        result = _protocol_sim(config, setup, plan.protocol_options).run()
    except SimulationError as exc:
        raise UsageError(f"{config.protocol} cannot finish on these settings: {exc}") from None
    finally:
        if bar is not None:
            bar.close()
    runtime_s = time.perf_counter() - started
    # the abort happened only if the run was still going at the kill (the engine was cut there)
    aborted_at_s = abort_s if abort_s is not None and engine.pending() else None
    accuracy = math.final()
    total_steps = sum(w["iterations"] for w in result["workers"])
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
        "bytes_sent": setup.network.bytes_sent,
        "bytes_sent_per_sample": (setup.network.bytes_sent / (total_steps * config.batch_size)
                                  if total_steps and config.batch_size else None),
        # a model message's float32 bytes over its bytes as sent (control messages are not compressed)
        "compression_ratio": 4.0 * params / setup.message_bytes if setup.message_bytes else 1.0,
        "sim_runtime_s": runtime_s,
        "events_per_s": engine.events / runtime_s if runtime_s > 0 else None,
    }
    if plan.protocol_options.caches_member_sets:
        extra["communicator_cache"] = plan.protocol_options.communicator_cache
    extra.update(result.get("extra", {}))
    if aborted_at_s is not None:
        extra.update(aborted_at_s=aborted_at_s, workers_lost=1)
    record = build_metrics(
        protocol=config.protocol,
        workers=result["workers"],
        wall_time_s=result["wall_time_s"],
        batch_size=config.batch_size,
        standalone_iteration_s=_standalone_step_s(slowdown, compute_ms, result["workers"]),
        alive_fraction=_alive_fraction(result, n),
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


def _standalone_step_s(slowdown, compute_ms: float, workers: list[dict]) -> list[float]:
    """Each worker's own seconds per local step when it never waits: the compute time times its slowdown
    factor, averaged (a trace) over the steps the worker actually reached, not over an expected count."""
    return [compute_ms / 1000.0 * slowdown.expected_factor(i, max(1, w["iterations"]))
            for i, w in enumerate(workers)]


def _alive_fraction(result: dict, n: int) -> list[float]:
    """The share of the run each worker was alive (``--fail``): a dead worker's standalone speed counts in
    the ideal only up to its death, as the runtime's record weights it (:mod:`hetrain.jobs.run`)."""
    wall_s = result["wall_time_s"]
    alive = [1.0] * n
    for death in (result.get("extra") or {}).get("recoveries") or ():
        alive[death["worker"]] = min(1.0, death["t_s"] / wall_s) if wall_s > 0 else 0.0
    return alive


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
    """``--fail``'s (time_s, worker) kills, up to the run's horizon (fixed kills: every one)."""
    from hetrain.faults import parse_fail

    spec = parse_fail(config.fail, config.seed)
    if not spec.active:
        return ()
    horizon = config.time_budget_s
    if horizon is None and not spec.rate_per_min:  # fixed kills: every one (a kill after the run ends is a no-op)
        return tuple(spec.fixed)
    if horizon is None:  # random kills in an iteration-limited run: at most every iteration at the slowest pace
        slowest = max(slowdown.expected_factor(i) for i in range(config.num_workers))
        horizon = 10.0 * config.iterations * compute_ms / 1000.0 * slowest
    return tuple(spec.kills(config.num_workers, horizon))


def _protocol_sim(config: RunConfig, setup: SimSetup, protocol_options=None):
    """The registry's simulated shell for ``config.protocol``, driving the same pure logic as the runtime
    (``protocol_options``: the options as fitted by :func:`check_run`; default the config's own)."""
    options = config.protocol_options() if protocol_options is None else protocol_options
    return config.protocol_spec.simulator_factory()(setup, options, config.seed)
