"""Candidate configurations, each simulated on a measured profile, and their ranking.

A candidate is a protocol with a few of its main options (Hop's topology and backup workers, Prague's
group size and Group Generator mode) and, where the links are slow, local steps or compression. Each is
simulated with every worker's *measured* compute time and transient slowdowns, the measured model size
and the all-reduce step the measurement saw: for its speed (``--math none``) and, for the fastest few
whose optimization the simulator's model math covers (the digits MLP, SGD, no compression), for its time
to the target accuracy (``--math digits``, the job's momentum). Candidates predicted to reach the target
rank first, soonest first; then those whose accuracy is not predicted, then those predicted to miss it,
each by samples/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetrain.config import RunConfig

SLOW_LINK_SHARE = 0.25  # an all-reduce costing this share of the median compute time or more: links are slow
SIM_STEPS = 60  # the slowest worker's iterations each timing simulation covers
ACCURACY_CANDIDATES = 6  # the fastest candidates whose time to target is simulated (the model math costs ~1 s each)
DEFAULT_HORIZON_S = 60.0  # simulated seconds to look for the target in, when the job gives no --time-budget
MAX_HORIZON_S = 120.0  # ... and at most (the model math's cost grows with it)
MAX_MATH_GRADIENTS = 4000  # the model math's gradients per run at most (95% on digits takes some 300-600)
FIRST_HORIZON_S = 15.0  # the model math looks this far first; the whole horizon only if no candidate got there
ACCURACY_SEEDS = 3  # model-math runs per candidate (other batches, initial model, groups): the median time counts
EVAL_POINTS_PER_S = 8  # accuracy-curve points per simulated second of the fastest worker (a real run: every 0.5 s)


@dataclass(frozen=True)
class Candidate:
    """One configuration to try: a protocol, its options, communication settings, and a note."""

    protocol: str
    options: dict = field(default_factory=dict)
    comm: dict = field(default_factory=dict)
    note: str = ""

    @property
    def name(self) -> str:
        parts = [self.protocol] + [f"{k}={v}" for k, v in {**self.options, **self.comm}.items()]
        return " ".join(parts)


def links_are_slow(profile: dict) -> bool:
    """Emulated links were given, or the measured all-reduce costs a quarter of a median iteration or more."""
    if profile.get("link_mbps") or profile.get("link_latency_ms"):
        return True
    compute = sorted(profile["compute_ms"])
    return profile["allreduce_ms"] >= SLOW_LINK_SHARE * compute[len(compute) // 2]


def candidates_for(profile: dict) -> list[Candidate]:
    """The configurations worth simulating for ``profile`` (allreduce first: the baseline)."""
    n = profile["num_workers"]
    found = [Candidate("allreduce"),
             Candidate("dpsgd", {"topology": "ring"}),
             Candidate("hop", {"topology": "ring", "backup": 0}),
             Candidate("hop", {"topology": "ring", "backup": 1}),
             Candidate("prague", {"group_size": 2, "gg": "smart"})]
    if n >= 4:
        found += [Candidate("hop", {"topology": "double_ring", "backup": 1}),
                  Candidate("prague", {"group_size": 4, "gg": "smart"}),
                  Candidate("prague", {"group_size": 2, "gg": "random"})]
    if links_are_slow(profile):
        changes = "changes the optimization"
        found += [Candidate("hop", {"topology": "ring", "backup": 0}, {"sync_every": 4}, note=changes),
                  Candidate("prague", {"group_size": 2, "gg": "smart"}, {"sync_every": 4}, note=changes),
                  Candidate("hop", {"topology": "ring", "backup": 0}, {"compression": "int8"}, note=changes),
                  Candidate("allreduce", comm={"compression": "bf16"}, note=changes)]
    return found


def horizon_s(base: RunConfig) -> float:
    """Simulated seconds in which the time to target is looked for: the job's time budget, within bounds."""
    return min(MAX_HORIZON_S, base.time_budget_s or DEFAULT_HORIZON_S)


def sim_config(profile: dict, base: RunConfig, candidate: Candidate, slowdown: tuple[float, str]) -> RunConfig:
    """The simulator's run for ``candidate`` on the *measured* profile (``slowdown``: the fastest worker's
    compute ms and the spec of every worker's measured speed, from :func:`~hetrain.advisor.variability.
    simulated_slowdown`; the model size), keeping the user's batch size, seed, lr and emulated links."""
    compute_ms, spec = slowdown
    slowest_ms = max(profile["compute_ms"])
    link = {k: base.comm.get(k) for k in ("link_mbps", "link_latency_ms") if base.comm.get(k) is not None}
    return RunConfig(protocol=candidate.protocol, num_workers=profile["num_workers"], workload="synthetic",
                     model_params=profile["model_params"] or base.model_params, batch_size=base.batch_size,
                     seed=base.seed, slowdown=spec, compute_ms=compute_ms, momentum=0.0, data_split="whole",
                     lr=base.lr, target_accuracy=base.target_accuracy,
                     time_budget_s=SIM_STEPS * slowest_ms / 1000.0, options=dict(candidate.options),
                     comm={**link, **candidate.comm})


def accuracy_is_modelled(base: RunConfig, candidate: Candidate) -> bool:
    """Whether the simulator's model math covers ``candidate`` on this job: the digits MLP trained by SGD
    toward an accuracy, and no compression (the math averages full models)."""
    return (base.workload == "mlp" and base.resolved_optimizer() == "sgd" and base.target_loss is None
            and "compression" not in candidate.comm)


def network_for(profile: dict, base: RunConfig):
    """The simulator's network with the all-reduce step the measurement saw: a ring all-reduce over n
    workers takes 2(n-1) steps, so one step is the measured all-reduce time over 2(n-1), less what the
    emulated links (``--link-mbps``, ``--link-latency-ms``) take, which the simulator adds on its own."""
    from hetrain.sim.network import NetworkParams
    from hetrain.transport.link_spec import ring_allreduce_bytes

    n = profile["num_workers"]
    measured_s = profile["allreduce_ms"] / 1000.0
    link = _link_only(base).comm_settings().link
    if link is not None and n > 1 and profile.get("model_params"):
        sent = ring_allreduce_bytes(n, 4.0 * profile["model_params"])
        measured_s = max(0.0, measured_s - link.collective_s(range(n), sent, sent, 2 * (n - 1)))
    step_us = 1e6 * measured_s / (2 * (n - 1)) if n > 1 else None
    return NetworkParams(collective_step_us=step_us if step_us and step_us > 0 else None)


def _link_only(base: RunConfig) -> RunConfig:
    return RunConfig(num_workers=base.num_workers, comm={k: base.comm.get(k) for k in ("link_mbps", "link_latency_ms")
                                                         if base.comm.get(k) is not None})


def collective_ms(profile: dict, base: RunConfig, slowdown: tuple[float, str]) -> float:
    """The all-reduce's own cost: what the measuring run's slowest worker waited per iteration, less what it
    waits for the others' transient slowdowns (an all-reduce with a free collective simulated on the same
    speeds). Without spikes that is nothing: the slowest worker waits only for the collective."""
    from hetrain.sim.network import NetworkParams
    from hetrain.sim.runner import SimOptions, simulate

    waited = profile["allreduce_ms"]
    if not any(profile.get("spikes") or []):
        return waited
    config = sim_config(profile, base, Candidate("allreduce"), slowdown).replace(comm={})
    slowest = simulate(config.validate(), SimOptions(NetworkParams(collective_step_us=0.0)))["workers"][
        profile.get("slowest_worker", 0)]
    return max(0.0, waited - 1000.0 * slowest["wait_s"] / max(1, slowest["iterations"]))


def predict(profile: dict, base: RunConfig, candidate: Candidate, slowdown: tuple[float, str]) -> dict:
    """Simulate ``candidate``'s timing on ``profile``; its predicted figures (time to target: not yet)."""
    from hetrain.sim.runner import SimOptions, simulate

    record = simulate(sim_config(profile, base, candidate, slowdown).validate(), SimOptions(network_for(profile, base)))
    return {"name": candidate.name, "protocol": candidate.protocol, "options": candidate.options,
            "comm": candidate.comm, "note": candidate.note,
            "samples_per_s": record["samples_per_s"],
            "heterogeneity_efficiency": record["heterogeneity_efficiency"],
            "time_to_target_s": None, "accuracy_predicted": False,
            "bytes_per_sample": record["bytes_sent_per_sample"],
            "simulated_s": record["wall_time_s"]}


def predict_accuracy(profile: dict, base: RunConfig, candidate: Candidate, slowdown: tuple[float, str],
                     horizon: float) -> dict:
    """Simulate ``candidate`` with the digits MLP's math for ``horizon`` simulated seconds (each run ends
    where its averaged model reaches the target), from :data:`ACCURACY_SEEDS` seeds: its predicted time to
    the target accuracy (the median over the seeds; None if that is not within the horizon) and the
    averaged model's accuracy where the run ended (the median too)."""
    from hetrain.sim.runner import SimOptions, simulate

    options = SimOptions(network_for(profile, base), math="digits", math_momentum=base.momentum or 0.0,
                         math_eval_points=max(20, int(EVAL_POINTS_PER_S * horizon)), math_stop_at_target=True)
    config = sim_config(profile, base, candidate, slowdown).replace(workload="mlp", time_budget_s=horizon)
    records = [simulate(config.replace(seed=base.seed + k).validate(), options) for k in range(ACCURACY_SEEDS)]
    times = sorted(r["time_to_target_s"] if r["time_to_target_s"] is not None else float("inf") for r in records)
    middle = times[len(times) // 2]
    finals = sorted(r["final_accuracy_avg_model"] for r in records)
    return {"time_to_target_s": None if middle == float("inf") else middle, "accuracy_predicted": True,
            "time_to_target_seeds_s": [None if t == float("inf") else round(t, 3) for t in times],
            "final_accuracy_avg_model": finals[len(finals) // 2], "horizon_s": horizon}


def predict_all(profile: dict, base: RunConfig, slowdown: tuple[float, str]) -> list[dict]:
    """Every candidate's timing, and the time to target of the :data:`ACCURACY_CANDIDATES` fastest whose
    accuracy the simulator models: within :data:`FIRST_HORIZON_S` simulated seconds, and within the whole
    :func:`horizon_s` only if none got there (a candidate that did is ahead of every one that did not, so
    the ranking is the same as with the whole horizon, at a fraction of the cost)."""
    found = candidates_for(profile)
    predictions = [predict(profile, base, c, slowdown) for c in found]
    modelled = [(p, c) for p, c in zip(predictions, found) if accuracy_is_modelled(base, c)]
    modelled.sort(key=lambda pc: -pc[0]["samples_per_s"])
    chosen = modelled[:ACCURACY_CANDIDATES]
    # at most MAX_MATH_GRADIENTS gradients: a job of fast workers (real compute of a few ms) is looked at for
    # fewer simulated seconds, as it needs as many gradients to reach the target as a slow one
    horizon = min(horizon_s(base), MAX_MATH_GRADIENTS * slowdown[0] / 1000.0 / profile["num_workers"])
    for limit in sorted({min(horizon, FIRST_HORIZON_S), horizon}):
        for prediction, candidate in chosen:
            prediction.update(predict_accuracy(profile, base, candidate, slowdown, limit))
        if any(p["time_to_target_s"] is not None for p, _ in chosen):
            break
    return predictions


def rank(predictions: list[dict]) -> list[dict]:
    """Best first: those predicted to reach the target, soonest first; then those whose accuracy was not
    predicted; then those predicted to miss it; within the last two (and on ties) by samples/s, and on ties
    in the order they were listed."""
    def key(p: dict) -> tuple:
        if p["time_to_target_s"] is not None:
            return (0, p["time_to_target_s"], -p["samples_per_s"])
        return (2 if p.get("accuracy_predicted") else 1, 0.0, -p["samples_per_s"])

    return sorted(predictions, key=key)
