"""Candidate configurations, each simulated on a measured profile, and their ranking.

A candidate is a protocol with a few of its main options (Hop's topology and backup workers, Prague's
group size and Group Generator mode) and, where the links are slow, local steps or compression. Each is
simulated (timing only: ``--math none``) with every worker's *measured* compute time, the measured model
size and the all-reduce step the measurement saw; candidates are ranked by predicted samples/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetrain.advisor.profile import slowdown_of
from hetrain.config import RunConfig

SLOW_LINK_SHARE = 0.25  # an all-reduce costing this share of the median compute time or more: links are slow
SIM_STEPS = 60  # the slowest worker's iterations each simulation covers


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
             Candidate("prague", {"group_size": 2, "gg": "smart"})]
    if n >= 4:
        found += [Candidate("hop", {"topology": "double_ring", "backup": 1}),
                  Candidate("prague", {"group_size": 4, "gg": "smart"}),
                  Candidate("prague", {"group_size": 2, "gg": "random"})]
    if links_are_slow(profile):
        changes = "changes the optimization: accuracy not predicted"
        found += [Candidate("hop", {"topology": "ring", "backup": 0}, {"sync_every": 4}, note=changes),
                  Candidate("prague", {"group_size": 2, "gg": "smart"}, {"sync_every": 4}, note=changes),
                  Candidate("hop", {"topology": "ring", "backup": 0}, {"compression": "int8"}, note=changes),
                  Candidate("allreduce", comm={"compression": "bf16"}, note=changes)]
    return found


def sim_config(profile: dict, base: RunConfig, candidate: Candidate) -> RunConfig:
    """The simulator's run for ``candidate`` on the *measured* profile (speeds, model size), keeping the
    user's batch size, seed and emulated links from ``base``."""
    compute_ms, slowdown = slowdown_of(profile)
    slowest_ms = max(profile["compute_ms"])
    link = {k: base.comm.get(k) for k in ("link_mbps", "link_latency_ms") if base.comm.get(k) is not None}
    return RunConfig(protocol=candidate.protocol, num_workers=profile["num_workers"], workload="synthetic",
                     model_params=profile["model_params"] or base.model_params, batch_size=base.batch_size,
                     seed=base.seed, slowdown=slowdown, compute_ms=compute_ms, momentum=0.0, data_split="whole",
                     time_budget_s=SIM_STEPS * slowest_ms / 1000.0, options=dict(candidate.options),
                     comm={**link, **candidate.comm})


def network_for(profile: dict):
    """The simulator's network with the all-reduce step the measurement saw: a ring all-reduce over n
    workers takes 2(n-1) steps, so one step is the measured all-reduce time over 2(n-1)."""
    from hetrain.sim.network import NetworkParams

    n = profile["num_workers"]
    step_us = 1000.0 * profile["allreduce_ms"] / (2 * (n - 1)) if n > 1 else None
    return NetworkParams(collective_step_us=step_us if step_us and step_us > 0 else None)


def predict(profile: dict, base: RunConfig, candidate: Candidate) -> dict:
    """Simulate ``candidate`` on ``profile``; its predicted figures."""
    from hetrain.sim.runner import SimOptions, simulate

    record = simulate(sim_config(profile, base, candidate).validate(), SimOptions(network_for(profile)))
    return {"name": candidate.name, "protocol": candidate.protocol, "options": candidate.options,
            "comm": candidate.comm, "note": candidate.note,
            "samples_per_s": record["samples_per_s"],
            "heterogeneity_efficiency": record["heterogeneity_efficiency"],
            "time_to_target_s": record["time_to_target_s"],
            "bytes_per_sample": record["bytes_sent_per_sample"],
            "simulated_s": record["wall_time_s"]}


def rank(predictions: list[dict]) -> list[dict]:
    """Best first: highest predicted samples/s (ties: the order they were listed in)."""
    return sorted(predictions, key=lambda p: -p["samples_per_s"])
