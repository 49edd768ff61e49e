"""The advisor's time to target (the simulator's model math) and its transient slowdowns (measured, simulated)."""

import csv

import numpy as np
import pytest

from hetrain.advisor import candidates as cand
from hetrain.advisor.advice import recommend
from hetrain.advisor.profile import profile_from_record
from hetrain.advisor.variability import simulated_slowdown, steady_compute_ms
from hetrain.commands.advise import format_table
from hetrain.config import RunConfig
from hetrain.jobs.compute_ledger import ComputeLedger
from hetrain.sim.math_model import DigitsMath


def _profile(compute_ms, spikes=None, allreduce_ms=0.5, **extra):
    n = len(compute_ms)
    return {"num_workers": n, "compute_ms": list(compute_ms), "compute_variability": None,
            "spikes": spikes or [None] * n, "model_params": 4810, "allreduce_ms": allreduce_ms,
            "slowest_worker": 0, "link_mbps": None, "link_latency_ms": None, "measured_s": 5.0, **extra}


def _prediction(name, samples_per_s, time_to_target_s, accuracy_predicted=True):
    return {"name": name, "samples_per_s": samples_per_s, "time_to_target_s": time_to_target_s,
            "accuracy_predicted": accuracy_predicted}


def test_the_ranking_puts_the_soonest_to_target_first_not_the_fastest():
    ranked = cand.rank([_prediction("fast but late", 5000, 8.0), _prediction("missed", 6000, None),
                        _prediction("not modelled", 9000, None, accuracy_predicted=False),
                        _prediction("soonest", 4000, 3.0)])
    assert [p["name"] for p in ranked] == ["soonest", "fast but late", "not modelled", "missed"]


def test_advice_predicts_time_to_target_and_allreduce_behind_a_5x_worker_is_later():
    advice = recommend(_profile([250.0] + [50.0] * 7), RunConfig(num_workers=8, compute_ms=50, time_budget_s=30))
    best = advice["candidates"][0]
    assert best["accuracy_predicted"] and best["time_to_target_s"] is not None, best
    assert f"{best['time_to_target_s']:.1f} s to the target" in advice["why"]
    first_row = format_table(advice).splitlines()[2]
    assert best["name"] in first_row and f"{best['time_to_target_s']:.1f}s" in first_row.split(), first_row
    seeds = best["time_to_target_seeds_s"]  # three model-math runs, the median counts
    assert len(seeds) == 3 and best["time_to_target_s"] == pytest.approx(sorted(seeds)[1], abs=1e-3), seeds
    allreduce = next(c for c in advice["candidates"] if c["name"] == "allreduce")
    assert allreduce["accuracy_predicted"] or allreduce["samples_per_s"] < best["samples_per_s"]
    assert allreduce["time_to_target_s"] is None or allreduce["time_to_target_s"] > 2 * best["time_to_target_s"]
    compressed = next(c for c in advice["candidates"] if "compression" in c["comm"]) if any(
        "compression" in c["comm"] for c in advice["candidates"]) else None
    assert compressed is None or not compressed["accuracy_predicted"]


def test_the_model_math_takes_momentum_as_torch_sgd_does():
    """Three steps on one fixed batch: heavy-ball v = m v + g, p -= lr v (torch.optim.SGD, no dampening)."""
    import torch

    math = DigitsMath(1, batch_size=16, lr=0.1, momentum=0.9)
    xb, yb = math.batch(0)
    math.batch = lambda worker: (xb, yb)
    flat = torch.tensor(math.params[0].copy(), requires_grad=False)
    reference = torch.nn.Parameter(flat.clone())
    optimizer = torch.optim.SGD([reference], lr=0.1, momentum=0.9)
    for _ in range(3):
        gradient = math.gradient(reference.detach().numpy().copy(), xb, yb)
        reference.grad = torch.tensor(gradient)
        optimizer.step()
        math.local_step(0)
    assert np.allclose(math.params[0], reference.detach().numpy(), atol=1e-5)
    plain = DigitsMath(1, batch_size=16, lr=0.1)
    plain.batch = lambda worker: (xb, yb)
    for _ in range(3):
        plain.local_step(0)
    assert not np.allclose(plain.params[0], math.params[0], atol=1e-4), "momentum changed nothing"


def test_the_ledger_counts_transient_slowdowns_after_the_start():
    ledger = ComputeLedger()
    phases = [0.5, 0.2] + [0.3 if i % 10 == 3 else 0.05 for i in range(100)]  # the start, then 10% at 6x
    for phase in phases:
        ledger.record(0.05, phase, 0.002)
    summary = ledger.summary()
    assert summary["spike_share"] == pytest.approx(0.1)
    assert summary["spike_to_median"] == pytest.approx(6.0, rel=1e-3)
    assert summary["steady_ms_mean"] == pytest.approx(50.0, rel=1e-3)
    steady = ComputeLedger()
    for phase in [0.05, 0.2] + [0.05] * 20:
        steady.record(0.05, phase, 0.002)
    assert steady.summary()["spike_share"] == 0 and steady.summary()["spike_to_median"] is None


def _spiking_record():
    """8 workers averaging 75 ms: 50 ms steady, one iteration in ten at 300 ms."""
    phase = {"achieved_ms_mean": 75.0, "achieved_ms_median": 50.0, "spike_share": 0.1, "spike_to_median": 6.0,
             "steady_ms_mean": 50.0}
    worker = {"iterations": 40, "compute_s": 3.0, "wait_s": 5.4, "exchanges": 40,
              "uncompressed_bytes": 4810 * 4 * 1.75 * 40, "compute_phase": phase}
    return {"protocol": "allreduce", "wall_time_s": 8.4, "samples_per_s": 1200.0,
            "config": {"slowdown": "random:p=0.1,factor=6", "compute_ms": 50.0, "batch_size": 32},
            "workers": [dict(worker) for _ in range(8)]}


def test_measured_spikes_are_simulated_as_a_trace_drawn_from_their_distribution(tmp_path):
    profile = profile_from_record(_spiking_record())
    assert profile["spikes"] == [{"share": 0.1, "factor": 6.0}] * 8
    assert steady_compute_ms(profile) == [50.0] * 8
    compute_ms, spec = simulated_slowdown(profile, tmp_path, 30.0, seed=0)
    assert compute_ms == 50.0 and spec.startswith("trace:")
    with open(spec[len("trace:"):], newline="") as handle:
        rows = list(csv.DictReader(handle))
    per_worker = [sum(int(r["worker"]) == w for r in rows) for w in range(8)]
    drawn = 8 * int(1.25 * 30.0 / 0.05)
    assert sum(per_worker) == pytest.approx(0.1 * drawn, rel=0.25) and min(per_worker) > 0
    assert {float(r["factor"]) for r in rows} == {6.0}


def test_transient_stragglers_slow_allreduce_in_the_prediction_and_are_taken_out_of_its_measured_cost():
    """Every worker averages 75 ms: as equal steady workers allreduce would run near 8 x 32 / 75 ms; with
    each worker's spikes simulated it waits for the slowest of eight at every step."""
    record = _spiking_record()
    profile = profile_from_record(record)
    assert profile["allreduce_ms"] == pytest.approx(135.0)  # what worker 0 waited: mostly others' spikes
    advice = recommend(profile, RunConfig(num_workers=8, compute_ms=50, time_budget_s=20))
    allreduce = next(c for c in advice["candidates"] if c["name"] == "allreduce")
    assert allreduce["samples_per_s"] < 0.6 * 8 * 32 / 0.075, allreduce
    prague = next(c for c in advice["candidates"] if c["name"] == "prague group_size=2 gg=smart")
    assert prague["samples_per_s"] < 0.9 * 8 * 32 / 0.075, "a pair waits for its partner's spikes"
    assert advice["recommended"]["protocol"] != "allreduce"
    assert advice["profile"]["allreduce_wait_ms"] == pytest.approx(135.0)
    assert advice["profile"]["allreduce_ms"] < 0.5 * 135.0, "the others' spikes were charged to the collective"
    assert "slow down transiently" in advice["why"]


def test_the_measured_all_reduce_on_slow_emulated_links_is_not_charged_twice():
    """Behind 1 Mbit/s links the measured all-reduce (291 ms) is nearly all link time, which the simulator
    adds on its own: one all-reduce iteration is the 5x worker's 250 ms plus the measured 291 ms."""
    profile = _profile([250.0] + [50.0] * 7, allreduce_ms=291.0, link_mbps="1")
    advice = recommend(profile, RunConfig(num_workers=8, compute_ms=50, slowdown="0:5x", time_budget_s=20,
                                          comm={"link_mbps": "1"}))
    allreduce = next(c for c in advice["candidates"] if c["name"] == "allreduce")
    assert allreduce["samples_per_s"] == pytest.approx(8 * 32 / (0.250 + 0.291), rel=0.1), allreduce
