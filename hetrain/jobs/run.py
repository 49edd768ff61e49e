"""Run one training job (local processes or under torchrun) and write its record.

``run_training(config, out_dir)`` validates everything first (so bad input
writes nothing), starts ``config.num_workers`` warm local gloo/NCCL processes with
a progress bar, evaluates the models the workers snapshotted along the way,
and writes ``OUT/metrics.json`` (atomically) plus ``OUT/summary.txt``. A job
stopped by Ctrl-C or SIGTERM still writes what it has (``"interrupted": true``, ``"interrupted_by"``
the signal); a failed
job writes every worker's traceback to ``OUT/errors.log``.
Under torchrun, ``run_training_torchrun`` does the same from inside the job.
The record times the job's start and end (``startup_s``, ``teardown_s`` and each
worker's phases: :mod:`hetrain.jobs.phases`).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable

import torch
from tqdm import tqdm

from hetrain.config import RunConfig
from hetrain.data import Dataset, check_batch_fits, load_dataset
from hetrain.epoch_deal import dealt_epochs
from hetrain.jobs import checkpoint, interrupts, torchrun_restart
from hetrain.jobs.capacity import efficiency_basis, lost_worker_iteration_s
from hetrain.jobs.compute_ledger import job_compute_phase, over_target_warning
from hetrain.jobs.evaluation import evaluation_curve
from hetrain.jobs.local_job import JobResults, run_local
from hetrain.jobs.meter import process_started_at
from hetrain.jobs.phases import job_phases
from hetrain.jobs.process_guard import die_with_parent
from hetrain.jobs.train_worker import train_worker
from hetrain.jobs.warm_start import start_early
from hetrain.metrics import build_metrics, format_summary
from hetrain.outputs import prepare_out_dir, write_json_atomic, write_text_atomic
from hetrain.protocols.options import OptionError
from hetrain.run_checks import check_before_start
from hetrain.slowdown import parse_slowdown


def check_run_config(config: RunConfig, devices_here: bool = True) -> RunConfig:
    """Every check that can be made before a process starts; raises UsageError.
    ``devices_here``: the workers run on this machine (not on a Ray cluster's nodes), so its GPUs count."""
    check_before_start(config)
    if devices_here:
        check_local_devices(config)
    fitted_protocol_options(config)  # a model too large for --comm-memory-mb is refused here
    return config


def check_local_devices(config: RunConfig, workers_here: int | None = None) -> None:
    """This machine has the GPUs the run asks for (``workers_here`` of its workers run here: default all;
    under torchrun this node's ranks, ``LOCAL_WORLD_SIZE``, not the job's world size)."""
    workers_here = config.num_workers if workers_here is None else workers_here
    if config.device == "cuda" and not torch.cuda.is_available():
        raise OptionError("{device} cuda was asked for, but this machine has no CUDA device; use {device} cpu")
    if config.resolved_backend() == "nccl" and workers_here > torch.cuda.device_count():
        raise OptionError(f"NCCL runs one worker per GPU: {workers_here} workers here, "
                          f"{torch.cuda.device_count()} GPU(s); use {{num_workers}} {torch.cuda.device_count()}, "
                          "or {backend} gloo (workers share GPUs, messages go through the host)")


def fitted_protocol_options(config: RunConfig):
    """The protocol's options with its communicator cache sized to ``--comm-memory-mb`` for this run's model
    (built on ``meta``: nothing allocated), as every worker's protocol shell sizes its own
    (:func:`hetrain.runtime.prague.fit_to_memory`), so the Group Generator served here mirrors the workers'
    caches exactly. OptionError when one member set does not fit."""
    options = config.protocol_options()
    if not options.caches_member_sets:
        return options
    from hetrain.data import build_model
    from hetrain.runtime.flat_state import averaged_nbytes

    comm = config.comm_settings()
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # build_model seeds the global generator
        model = build_model(config.workload, config.model_params, config.seed)
    return options.fit_memory(averaged_nbytes(model, anchors=comm.outer_named != "none"),
                              compressed=comm.compression.enabled, nccl=config.resolved_backend() == "nccl",
                              num_workers=config.world_size)


def run_training(config: RunConfig, out_dir: str | None, progress: bool = True, label: str | None = None,
                 launched_at: float | None = None, log_shared_dir: str | None = None,
                 launch: Callable[..., JobResults] | None = None, service_host: str = "127.0.0.1") -> dict:
    """Start the local job, then evaluate and record it; returns the metrics record.

    A stop signal (Ctrl-C, SIGTERM) during the training ends the workers at their next iteration and
    the record reads ``"interrupted": true``. One that comes after the workers ended lets the record be
    written whole, and the returned record carries ``"stopped_after_the_job"`` (the signal's name) so
    that a caller running several jobs can stop too (``hetrain compare`` does).

    ``launched_at``: the ``time.time()`` the job counts its start-up from (default: now; ``hetrain
    train`` passes its own process's start, so ``startup_s`` covers the whole command).
    ``log_shared_dir``: where ``config.log``'s stores shared by several runs go (MLflow's; default
    ``out_dir``: :func:`hetrain.loggers.scalar_writers.make_writers`).
    ``launch``: what starts the workers, with :func:`run_local`'s arguments (default: it; a Ray job
    passes :func:`hetrain.ray.job.run_ray` with its placement); ``service_host``: the address the
    launcher's services (the Group Generator) bind, one the workers reach.
    """
    launched_at = time.time() if launched_at is None else launched_at
    check_run_config(config, devices_here=launch is None)
    if launch is None:
        start_early()  # the warm server imports while this process loads the data and sets up
    data = load_dataset(config.workload, config.seed)  # once, here: no worker imports scikit-learn
    check_batch_fits(config.workload, data, config.batch_size, config.world_size, config.data_split)
    if config.checkpoint_dir:  # checked before anything is written
        config = config.replace(resume=checkpoint.prepare(config.checkpoint_dir, config, config.resume))
    out = prepare_out_dir(out_dir) if out_dir else None
    if config.checkpoint_dir:
        checkpoint.start(config.checkpoint_dir, config, config.resume)
    bar = _ProgressBar(config, label or config.protocol, enabled=progress)
    logger = _run_logger(config, out, log_shared_dir)
    with interrupts.held_after_the_job() as held:  # a stop once the workers ended lets the record and the logs be written whole
        try:
            metrics = _run_local_job(config, out, data, bar, logger, launched_at, launch or run_local, service_host,
                                     progress)
        finally:
            if logger is not None:
                logger.close()
        if held.received and not metrics.get("interrupted"):  # the run was whole; its caller learns of the stop
            metrics["stopped_after_the_job"] = held.received  # (the record on disk may have been written first)
        return metrics


def _final_model_scores(workers: list[dict], curve: list[dict]) -> tuple[float | None, float | None]:
    """(accuracy, loss) of the model ``finish()`` left on every worker, as the one worker that evaluated it
    scored it (the lowest live rank); if that worker died after its finish, the averaged model of the
    curve's last point (the workers' models as their loops ended, averaged: what the final average
    averages, short of what it does about late updates)."""
    scored = next((w for w in workers if w.get("consensus_accuracy") is not None), None)
    if scored is not None:
        return scored["consensus_accuracy"], scored["consensus_loss"]
    if curve:
        return curve[-1]["accuracy_avg_model"], curve[-1]["loss_avg_model"]
    return None, None


def _run_logger(config: RunConfig, out, shared_dir: str | None):
    """The launcher's writer of ``config.log`` (None without an output directory or kinds)."""
    if out is None or not config.log:
        return None
    from hetrain.loggers.run_logger import RunLogger
    from hetrain.loggers.scalar_writers import make_writers

    writer = make_writers(config.log, out, config.protocol, config.record(), shared_dir=shared_dir)
    return RunLogger(writer, config.world_size, config.batch_size)


def _run_local_job(config: RunConfig, out, data: Dataset, bar, logger, launched_at: float, launch,
                   service_host: str, progress: bool) -> dict:
    gg = _launcher_gg(config, service_host)  # served here, so no worker's death takes it down
    if gg is not None:
        for rank in range(config.num_workers, config.world_size):  # vacant until a worker joins into it
            gg.handle({"op": "leave", "worker": rank})
    services = {"gg_address": (f"{gg.host}:{gg.port}", gg.secret)} if gg is not None else {}

    def on_message(rank: int, message) -> None:
        bar.update(rank, message)
        if logger is not None:
            logger.on_message(rank, message)

    def on_death(rank: int) -> None:
        bar.lost(rank)
        if logger is not None:
            logger.on_death(rank)
        if gg is not None:  # the Group Generator stops grouping the dead
            gg.handle({"op": "leave", "worker": rank})

    def on_join(rank: int, incarnation: int) -> None:
        bar.joined(rank)
        if logger is not None:
            logger.on_join(rank)
        if gg is not None:  # its replacement may be grouped again, with fresh communicators
            gg.handle({"op": "rejoin", "worker": rank, "incarnation": incarnation})

    try:
        results = launch(
            train_worker, config.num_workers, (config, services, data),
            backend=config.resolved_backend(), device=config.device,
            timeout_s=config.timeout_s, job_timeout_s=_job_timeout_s(config), on_message=on_message,
            log_path=out / "errors.log" if out is not None else None,
            on_failure=config.resolved_on_failure(), faults=_faults(config),
            heartbeat_timeout_s=config.heartbeat_timeout_s, on_death=on_death, on_join=on_join,
            **_membership_arguments(config, bar),
        )
    finally:
        bar.close()
        if gg is not None:
            gg.close()
    # the workers that left a rank joined again since: their records beside the rank's last worker's
    metrics = finalize_run(config, [*results, *getattr(results, "earlier", [])], out,
                           interrupted_by=results.interrupted_by, deaths=results.deaths,
                           joins=results.joins, leaves=getattr(results, "leaves", []),
                           joins_not_started=getattr(results, "joins_not_started", 0), gg_stats=gg.scheduler.stats() if gg is not None else None,
                           data=data, launched_at=launched_at, results_at=results.finished_at,
                           launcher_record=results.launcher, progress=progress)
    if logger is not None:
        logger.finish(metrics)
    return metrics


def _membership_arguments(config: RunConfig, bar) -> dict:
    """What the launcher takes beyond run_local's first arguments about members: a job that may grow
    (``max_workers``, ``joins``) and what the workers' protocols are built for (a launcher that aborts on a
    death still lets a worker leave); the lines saying who joins or leaves go above the progress bar."""
    from hetrain.join_spec import parse_join

    arguments = {"worker_on_failure": config.worker_on_failure(), "on_members": bar.say}
    if config.elastic:
        arguments.update(max_workers=config.world_size, joins=[(t, k) for t, k in parse_join(config.join).events])
    return arguments


def _launcher_gg(config: RunConfig, host: str = "127.0.0.1"):
    """The Group Generator of a local Prague / AD-PSGD job, served by the launcher on ``host`` (None for the
    others)."""
    from hetrain.groups.gg_service import GGServer
    from hetrain.transport.job_secret import new_secret

    scheduler = config.protocol_spec.make_scheduler(config.world_size, fitted_protocol_options(config), config.seed)
    if scheduler is None or config.world_size < 2:
        return None
    return GGServer(scheduler, host=host, secret=new_secret())  # to the workers with their arguments, not a store


def _faults(config: RunConfig) -> list:
    """``--fail``'s faults: the training clock's kills (``random:`` drawn up to the budget) and the rest."""
    from hetrain.faults import Fault, parse_fail

    spec = parse_fail(config.fail, config.seed)
    horizon = config.time_budget_s if config.time_budget_s is not None else 10**9
    kills = [Fault(worker, "train", t) for t, worker in spec.kills(config.world_size, horizon)]
    return kills + [f for f in spec.events if not (f.clock == "train" and f.signal == "kill")]


def run_training_torchrun(config: RunConfig, out_dir: str | None, progress: bool = True) -> dict | None:
    """Run as one rank of a torchrun job; rank 0 gathers, evaluates (``progress``: with a bar) and writes the
    record."""
    import torch.distributed as dist

    from hetrain.jobs.context import WorkerContext
    from hetrain.transport.job import init

    die_with_parent(os.getppid())  # torchrun's agent: no orphan if it is killed
    launched_at, connecting = process_started_at(), time.time()
    device = init(config.resolved_backend(), timeout_s=config.timeout_s, device=config.device)
    phases = {"launched_at": launched_at, "import_s": connecting - launched_at, "connect_s": time.time() - connecting}
    ctx = WorkerContext(dist.get_rank(), dist.get_world_size(), device, config.timeout_s, phases=phases)
    config = config.replace(num_workers=ctx.world_size)
    if config.resolved_on_failure() != "abort":
        # no launcher of ours watches the ranks: torchrun restarts the job (--max-restarts) from checkpoints
        if config.on_failure in ("continue", "respawn") and ctx.rank == 0:
            warnings.warn(f"--on-failure {config.on_failure} applies to local jobs; under torchrun a death ends "
                          "the job and torchrun --max-restarts restarts it from --checkpoint-dir", stacklevel=2)
        config = config.replace(on_failure="abort")
    if config.fail != "none":
        raise OptionError("{fail} injects failures in local jobs; under torchrun, kill ranks yourself")
    if config.max_workers is not None or config.join != "none":
        raise OptionError("{max_workers} and {join} grow local and Ray jobs; under torchrun the members are "
                          "torchrun's: with --nnodes MIN:MAX its agent restarts every rank when a node joins or "
                          "leaves, and hetrain resumes from {checkpoint_dir}")
    check_run_config(config, devices_here=False)  # the job spans nodes: this node's ranks against its GPUs
    check_local_devices(config, int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size)))
    out = prepare_out_dir(out_dir) if out_dir and ctx.rank == 0 else None
    if config.checkpoint_dir:  # rank 0 checks (and on a fresh start writes the manifest); all learn the verdict
        verdict = [None]
        if ctx.rank == 0:
            # a restart of this job after a death past its last checkpoint finishes it (nothing left to train)
            restarted = torchrun_restart.restarts_this_job(config.checkpoint_dir)
            verdict[0] = checkpoint.prepare(config.checkpoint_dir, config, config.resume, finished_ok=restarted)
            checkpoint.start(config.checkpoint_dir, config, verdict[0])
            torchrun_restart.note_attempt(config.checkpoint_dir)
        dist.broadcast_object_list(verdict, src=0)
        config = config.replace(resume=verdict[0])
    result = train_worker(ctx, config, {})
    gathered = [None] * ctx.world_size if ctx.rank == 0 else None
    dist.gather_object(result, gathered, dst=0)
    results_at = time.time()
    dist.barrier()
    if ctx.rank != 0:
        return None
    metrics = finalize_run(config, gathered, out, launched_at=min(r["worker"]["launched_at"] for r in gathered),
                           results_at=results_at, progress=progress)
    logger = _run_logger(config, out, None)  # no live reports under torchrun: the record's figures only
    if logger is not None:
        try:
            logger.finish(metrics)
        finally:
            logger.close()
    return metrics


def finalize_run(config: RunConfig, results: list[dict | None], out, interrupted_by: str | None = None,
                 deaths: list[dict] | None = None, joins: list[dict] | None = None, leaves: list[dict] | None = None,
                 joins_not_started: int = 0,
                 gg_stats: dict | None = None, data: Dataset | None = None, launched_at: float | None = None,
                 results_at: float | None = None, launcher_record: dict | None = None, progress: bool = False) -> dict:
    """Build, write and return the run's record. ``results`` has None for workers that died.

    ``data``: the workload's data if the caller has it loaded; ``launched_at``: when the job started
    (``time.time()``), for ``startup_s``; ``results_at``: when the last result came in, for ``teardown_s``;
    ``launcher_record``: what the launcher adds to the record (a Ray job: each worker's node); ``progress``:
    show the evaluation of the kept models (tens of seconds for the LM) as a bar.
    """
    deaths = deaths or []
    survivors = [r for r in results if r is not None]
    workers = [r["worker"] for r in survivors]
    members = [w for w in workers if not w.get("left")]  # those that held the final model (a leaver did not)
    wall_s = max(w["loop_s"] for w in workers)
    timing = job_phases(workers, launched_at)
    _note_members(workers, joins or [])
    curve, worst_worker_at_target_s = evaluation_curve(config, [r["snapshots"] for r in survivors], data,
                                                       progress=progress)
    lost = _lost_workers(config, workers, deaths, wall_s)
    final = _final_model_scores(workers, curve)
    metrics = build_metrics(
        protocol=config.protocol,
        workers=workers + lost,
        wall_time_s=wall_s,
        batch_size=config.batch_size,
        standalone_iteration_s=[w["standalone_iteration_s"] for w in workers + lost],
        alive_fraction=[_alive_fraction(w, wall_s) for w in workers] + [w["alive_fraction"] for w in lost],
        accuracy_curve=curve,
        target_accuracy=config.target_accuracy,
        target_loss=config.resolved_target_loss(),
        time_to_target_worst_worker_s=worst_worker_at_target_s,
        efficiency_basis=efficiency_basis(config),
        final_accuracy_avg_model=final[0],
        final_accuracy_worst_worker=min(w["local_accuracy"] for w in members or workers),
        final_loss_avg_model=final[1],
        consensus_distance=workers[0].get("consensus_distance"),
        extra={"interrupted": interrupted_by is not None, "interrupted_by": interrupted_by, "resumed": config.resume,
               "on_failure": config.resolved_on_failure(),
               "workers_lost": len(deaths), "deaths": deaths,
               "workers_joined": sum(not j.get("stopped_before_settling") for j in joins or []),  # trained
               "joins": joins or [], "leaves": leaves or [], "workers_left": len(leaves or []),
               "joins_not_started": joins_not_started,
               "num_workers": config.num_workers, "max_workers": config.world_size,
               "final_members": len(members), **(gg_stats or {}),
               "epochs_dealt": dealt_epochs([w.get("epochs_dealt") for w in workers]) if config.deals_epochs else None,
               **timing, **(launcher_record or {}), **job_compute_phase(workers), "config": config.record()},
    )
    if (warning := over_target_warning(metrics)) is not None:
        print(warning, file=sys.stderr, flush=True)  # once per run, by the launcher (or torchrun's rank 0)
    # iterations that count: a dead worker's last gradient may never have left it
    metrics["goodput_samples_per_s"] = max(0, metrics["total_iterations"] - len(deaths)) * config.batch_size / wall_s
    metrics["teardown_s"] = time.time() - results_at if results_at is not None else None
    if out is not None:
        write_json_atomic(out / "metrics.json", metrics)
        write_text_atomic(out / "summary.txt", format_summary(metrics) + "\n")
    return metrics


def _note_members(workers: list[dict], joins: list[dict]) -> None:
    """Mark each worker that joined a vacant rank (``joined``), and give its join record ``first_step_s``:
    seconds from its process's start to its first step."""
    for join in joins:
        worker = next((w for w in workers if w["rank"] == join["rank"]
                       and w.get("incarnation") == join["incarnation"]), None)
        if worker is None:
            continue
        if join.get("new_member"):
            worker["joined"] = True
        if worker.get("first_iteration_s") is not None and worker.get("started_s") is not None:
            join["first_step_s"] = round(worker["first_iteration_s"] - worker["started_s"], 3)


def _alive_fraction(worker: dict, wall_s: float) -> float:
    """The share of the run's time a worker was there: from its start (a replacement's or a joiner's) to the
    end, or to its leave (its loop's end on the job's clock)."""
    if wall_s <= 0:
        return 1.0
    until = min(worker["loop_s"], wall_s) if worker.get("left") else wall_s
    return max(0.0, until - worker.get("started_t_s", 0.0)) / wall_s


def _lost_workers(config: RunConfig, survivors: list[dict], deaths: list[dict], wall_s: float) -> list[dict]:
    """What is known of the dead: their last reported gradient count and their share of the run's time."""
    if not deaths:
        return []
    slowdown = parse_slowdown(config.slowdown, config.seed)
    return [{"rank": d["rank"], "iterations": d["computed"], "compute_s": 0.0, "wait_s": 0.0, "died": d["how"],
             "standalone_iteration_s": lost_worker_iteration_s(config, slowdown, d["rank"], survivors),
             "alive_fraction": min(1.0, (d["t_s"] - d.get("started_t_s", 0.0)) / wall_s) if wall_s > 0 else 0.0}
            for d in deaths]


def _job_timeout_s(config: RunConfig) -> float | None:
    if config.time_budget_s is not None:
        return config.time_budget_s + 10 * config.timeout_s
    return None


class _ProgressBar:
    """Progress of the slowest worker, from the workers' reports (stderr, tqdm)."""

    def __init__(self, config: RunConfig, label: str, enabled: bool):
        self.by_time = config.iterations is None
        total = config.time_budget_s if self.by_time else config.iterations
        self.state: dict[int, dict] = {}
        self.dead: set[int] = set()
        self.members = set(range(config.num_workers))  # who trains now: the starting workers, then joins and losses
        self.training = False
        self.ending = False
        self.bar = tqdm(total=total, desc=label, unit="s" if self.by_time else "it", file=sys.stderr,
                        disable=not enabled, leave=False, dynamic_ncols=True,
                        mininterval=0.1 if sys.stderr.isatty() else 5.0,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total} {unit} {postfix}")

    def update(self, rank: int, message: dict) -> None:
        self.state[rank] = message
        live = {r: m for r, m in self.state.items() if r not in self.dead}
        values = [m["t_s"] if self.by_time else m["iteration"] for m in live.values()] or [0]
        self.bar.n = min(max(values) if self.by_time else min(values), self.bar.total)
        computed = sum(m["computed"] for m in self.state.values())
        lost = f", {len(self.dead)} lost or left" if self.dead else ""
        alive = len(self.members)  # not only those heard from: at the start, one has reported
        done = sum(bool(m.get("done")) for m in live.values())
        ending = f"; finishing (final average): {done} of {alive} done" if self.bar.n >= self.bar.total else ""
        self.bar.set_postfix_str(f"{computed} gradients, {alive} workers live{lost}{ending}", refresh=False)
        if (computed and not self.training) or (ending and not self.ending):  # shown at once, even in a log
            self.training, self.ending = True, bool(ending)  # (no tty): the first gradient, the finish
            self.bar.refresh()
        self.bar.update(0)  # redraws at most every mininterval

    def lost(self, rank: int) -> None:
        self.dead.add(rank)
        self.members.discard(rank)
        self.state.pop(rank, None)  # its replacement, if any, reports afresh

    def joined(self, rank: int) -> None:
        self.dead.discard(rank)
        self.members.add(rank)

    def say(self, line: str) -> None:
        """A line above the bar (who joins or leaves), shown also when the bar is off."""
        tqdm.write(f"hetrain: {line}", file=sys.stderr)

    def close(self) -> None:
        self.bar.close()
