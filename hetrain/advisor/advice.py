"""Advice: measure the job for a short while, simulate the candidates on that measurement, rank them.

:func:`advise` is ``hetrain.advise``; ``hetrain advise`` prints its record and ``hetrain train
--protocol auto`` trains with its first candidate.
"""

from __future__ import annotations

import shlex
import tempfile
import time

from hetrain.advisor import candidates as cand
from hetrain.advisor.profile import profile_from_record
from hetrain.advisor.variability import simulated_slowdown
from hetrain.config import RunConfig
from hetrain.errors import UsageError

MEASURE_PROTOCOL = "allreduce"  # every worker computes every step: each one's compute time is seen whole
DEFAULT_MEASURE_S = 5.0
# run options the recommended command repeats where they differ from RunConfig's defaults
PASSED_ON = {"slowdown": "--slowdown", "compute_ms": "--compute-ms", "data_split": "--data-split",
             "optimizer": "--optimizer", "lr": "--lr", "momentum": "--momentum",
             "target_accuracy": "--target-accuracy", "target_loss": "--target-loss", "fail": "--fail",
             "on_failure": "--on-failure", "eval_interval_s": "--eval-interval", "device": "--device",
             "backend": "--backend", "timeout_s": "--timeout", "heartbeat_timeout_s": "--heartbeat-timeout"}


def measuring_config(config: RunConfig, measure_s: float) -> RunConfig:
    """The short real run that measures ``config``'s job: the same workers, workload, speeds and links,
    under all-reduce, for ``measure_s`` seconds, with no failures, checkpoints or logs."""
    if not measure_s > 0:
        raise UsageError(f"--measure-s must be > 0 seconds, got {measure_s!r}")
    link = {k: config.comm.get(k) for k in ("link_mbps", "link_latency_ms") if config.comm.get(k) is not None}
    return config.replace(protocol=MEASURE_PROTOCOL, options={}, comm=link, iterations=None,
                          time_budget_s=measure_s, fail="none", on_failure=None, checkpoint_dir=None,
                          checkpoint_every_s=None, resume=False, log=())


def measure(config: RunConfig, measure_s: float = DEFAULT_MEASURE_S) -> dict:
    """Run ``config``'s job briefly for real and return its measured profile."""
    from hetrain.jobs.run import run_training

    record = run_training(measuring_config(config, measure_s), None, progress=False)
    return profile_from_record(record)


def recommend(profile: dict, config: RunConfig) -> dict:
    """Simulate every candidate on ``profile`` and rank them: the advice record (no real run)."""
    started = time.perf_counter()
    timing_s = cand.SIM_STEPS * max(profile["compute_ms"]) / 1000.0
    with tempfile.TemporaryDirectory(prefix="hetrain-advise-") as scratch:  # a spiking profile's trace
        slowdown = simulated_slowdown(profile, scratch, max(cand.horizon_s(config), timing_s), config.seed)
        waited = profile["allreduce_ms"]
        profile = {**profile, "allreduce_ms": round(cand.collective_ms(profile, config, slowdown), 3),
                   "allreduce_wait_ms": waited}
        ranked = cand.rank(cand.predict_all(profile, config, slowdown))
    best = ranked[0]
    return {"profile": profile, "candidates": ranked, "why": why(ranked, profile),
            "recommended": {**{k: best[k] for k in ("name", "protocol", "options", "comm")},
                            "command": train_command(config, best)},
            "simulate_s": round(time.perf_counter() - started, 3)}


def advise(config: RunConfig | None = None, *, measure_s: float = DEFAULT_MEASURE_S, **fields) -> dict:
    """Measure ``config``'s job (a RunConfig, or RunConfig's ``fields``) for ``measure_s`` seconds,
    simulate the candidates on what was measured, and return the advice record (``profile``, ranked
    ``candidates``, ``why``, ``recommended`` with its ``command``) that ``hetrain advise --json`` writes."""
    config = (config or RunConfig()).replace(**fields) if fields or config is None else config
    config = config.replace(protocol=MEASURE_PROTOCOL).validate()
    started = time.perf_counter()
    profile = measure(config, measure_s)
    measured_s = time.perf_counter() - started
    advice = recommend(profile, config)
    advice["measure_wall_s"] = round(measured_s, 3)
    return advice


def why(ranked: list[dict], profile: dict) -> str:
    """One line: why the first candidate wins."""
    best = ranked[0]
    compute = profile["compute_ms"]
    spread = max(compute) / min(compute) if min(compute) > 0 else float("inf")
    line = f"{best['name']} predicts {best['samples_per_s']:.0f} samples/s"
    if best["time_to_target_s"] is not None:
        line += f" and {best['time_to_target_s']:.1f} s to the target"
        later = [p for p in ranked[1:] if p["time_to_target_s"] is not None]
        if later:
            line += f" ({later[0]['name']}: {later[0]['time_to_target_s']:.1f} s)"
        unreached = [p["name"] for p in ranked if p.get("accuracy_predicted") and p["time_to_target_s"] is None]
        if "allreduce" in unreached:
            line += ", allreduce not within the horizon"
    if len(ranked) > 1:
        second = ranked[1]
        line += f", {best['samples_per_s'] / second['samples_per_s']:.2f}x the next ({second['name']})"
    allreduce = next((p for p in ranked if p["name"] == "allreduce"), None)
    if allreduce is not None and allreduce is not best:
        line += f" and {best['samples_per_s'] / allreduce['samples_per_s']:.2f}x allreduce"
    line += f"; measured: the slowest worker computes {spread:.1f}x the fastest"
    spiking = [s for s in profile.get("spikes") or [] if s]
    if spiking:
        share = sum(s["share"] for s in spiking) / len(spiking)
        line += (f", {len(spiking)} worker(s) slow down transiently ({100 * share:.0f}% of iterations, "
                 f"{max(s['factor'] for s in spiking):.1f}x)")
    if best["note"]:
        line += f" ({best['note']})"
    return line


def train_command(config: RunConfig, best: dict, out: str = "runs/advised") -> str:
    """The ``hetrain train`` command that runs ``best`` with the user's run options."""
    from hetrain.comm.settings import comm_fields, flag_of

    words = ["hetrain", "train", "--protocol", best["protocol"], "--workers", str(config.num_workers),
             "--workload", config.workload, "--batch-size", str(config.batch_size), "--seed", str(config.seed)]
    if config.workload == "synthetic":
        words += ["--model-params", str(config.model_params)]
    if config.time_budget_s is not None:
        words += ["--time-budget", f"{config.time_budget_s:g}"]
    elif config.iterations is not None:
        words += ["--iterations", str(config.iterations)]
    defaults = RunConfig()
    for name, flag in PASSED_ON.items():  # the other run options the user gave, as given
        value = getattr(config, name)
        if value is not None and value != getattr(defaults, name):
            words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    for name, value in best["options"].items():
        words += ["--" + name.replace("_", "-"), str(value)]
    flags = {f.name: flag_of(f) for f in comm_fields()}
    comm = {**{k: v for k, v in config.comm.items() if k in ("link_mbps", "link_latency_ms") and v is not None},
            **best["comm"]}
    for name, value in comm.items():
        words += [flags[name], str(value)]
    words += ["--out", out]
    return shlex.join(words)
