"""The advisor's logic on hand-made profiles: profile -> candidates -> simulated predictions -> ranking."""

import shlex

import pytest

from hetrain.advisor import candidates as cand
from hetrain.advisor.advice import recommend
from hetrain.advisor.profile import profile_from_record
from hetrain.advisor.variability import simulated_slowdown
from hetrain.cli import build_parser
from hetrain.config import RunConfig


def _profile(compute_ms, allreduce_ms=0.5, **extra):
    return {"num_workers": len(compute_ms), "compute_ms": list(compute_ms), "compute_variability": None,
            "model_params": 4810, "allreduce_ms": allreduce_ms, "link_mbps": None, "link_latency_ms": None,
            **extra}


def _worker(iterations, compute_s, wait_s, exchanges=None, message_bytes=4810 * 4 * 1.5):
    """A worker of a 4-worker all-reduce over the 4,810-parameter MLP: 2(n-1)/n of it sent per exchange."""
    exchanges = iterations if exchanges is None else exchanges
    return {"iterations": iterations, "compute_s": compute_s, "wait_s": wait_s, "exchanges": exchanges,
            "uncompressed_bytes": message_bytes * exchanges,
            "compute_phase": {"achieved_ms_mean": 1000 * compute_s / iterations * 1.1,
                              "achieved_ms_median": 1000 * compute_s / iterations}}


def test_a_profile_with_one_5x_slow_worker_does_not_recommend_allreduce():
    advice = recommend(_profile([250.0] + [50.0] * 7), RunConfig(num_workers=8, compute_ms=50, time_budget_s=30))
    names = [c["name"] for c in advice["candidates"]]
    assert advice["recommended"]["protocol"] != "allreduce"
    assert names.index(advice["recommended"]["name"]) == 0
    reached = [c["time_to_target_s"] for c in advice["candidates"] if c["time_to_target_s"] is not None]
    assert reached == sorted(reached) and advice["candidates"][0]["time_to_target_s"] is not None
    allreduce = next(c for c in advice["candidates"] if c["name"] == "allreduce")
    assert advice["candidates"][0]["samples_per_s"] > 2 * allreduce["samples_per_s"]
    assert "allreduce" in advice["why"] and "5.0x the fastest" in advice["why"]


def test_equal_workers_on_a_fast_link_may_recommend_allreduce():
    advice = recommend(_profile([50.0] * 8), RunConfig(num_workers=8, compute_ms=50, time_budget_s=30))
    best, allreduce = advice["candidates"][0], next(c for c in advice["candidates"] if c["name"] == "allreduce")
    assert allreduce["samples_per_s"] >= 0.98 * best["samples_per_s"]
    assert not any(c["comm"] for c in advice["candidates"]), "a fast link needs no local steps or compression"


def test_slow_links_add_local_steps_and_compression():
    slow = _profile([50.0] * 4, allreduce_ms=40.0)
    names = [c.name for c in cand.candidates_for(slow)]
    assert "hop topology=ring backup=0 sync_every=4" in names and "allreduce compression=bf16" in names
    assert cand.links_are_slow(_profile([50.0] * 4, link_mbps="100"))
    assert not cand.links_are_slow(_profile([50.0] * 4))


def test_the_profile_is_what_the_run_measured_not_what_the_flags_said():
    """Flags say every worker is alike; the run measured worker 2 at 4x: the simulation sees 4x."""
    record = {"protocol": "allreduce", "wall_time_s": 2.0, "samples_per_s": 100.0,
              "config": {"slowdown": "none", "compute_ms": 10.0, "batch_size": 32},
              "workers": [_worker(20, 0.2, 0.61), _worker(20, 0.2, 0.62), _worker(20, 0.8, 0.02),
                          _worker(20, 0.2, 0.6)]}
    profile = profile_from_record(record)
    assert profile["compute_ms"] == [10.0, 10.0, 40.0, 10.0]
    assert profile["model_params"] == 4810
    assert profile["allreduce_ms"] == 1.0  # the slowest worker's wait per iteration
    assert profile["compute_variability"][0] == pytest.approx(0.1)
    flags = RunConfig(num_workers=4, slowdown="none", compute_ms=10.0, time_budget_s=30)
    slowdown = simulated_slowdown(profile, "unused: no worker spikes", 30.0, 0)
    config = cand.sim_config(profile, flags, cand.Candidate("allreduce"), slowdown)
    assert (config.compute_ms, config.slowdown) == (10.0, "2:4.000x") == slowdown
    advice = recommend(profile, flags)
    assert advice["recommended"]["protocol"] != "allreduce"


def test_the_recommended_command_parses_as_hetrain_train():
    flags = RunConfig(num_workers=8, compute_ms=50, slowdown="0:5x", time_budget_s=30, comm={"link_mbps": "100"},
                      lr=0.05, data_split="shard")
    advice = recommend(_profile([250.0] + [50.0] * 7, link_mbps="100"), flags)
    words = shlex.split(advice["recommended"]["command"])
    assert words[:2] == ["hetrain", "train"]
    args = build_parser().parse_args(words[1:])
    best = advice["recommended"]
    assert (args.protocol, args.workers, args.slowdown, args.link_mbps) == (best["protocol"], 8, "0:5x", "100")
    assert (args.compute_ms, args.lr, args.data_split, args.time_budget_s) == (50.0, 0.05, "shard", 30.0)
    for name, value in {**best["options"], **best["comm"]}.items():
        assert getattr(args, name) == value
