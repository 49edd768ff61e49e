"""Simulated protocols against closed forms and exact event traces of tiny cases."""

import pytest

from hetrain.config import RunConfig
from hetrain.sim import NetworkParams, SimOptions, simulate
from hetrain.sim.math_model import DIGITS_PARAMS
from hetrain.sim.network import ring_allreduce_s

NET = NetworkParams(latency_us=100.0, bandwidth_gbps=8.0)
MODEL_BYTES = 4.0 * DIGITS_PARAMS
TRANSFER_S = MODEL_BYTES / 1e9


def run(protocol, n, iterations, slowdown="none", trace=False, **options):
    if protocol == "prague":
        options.setdefault("group_size", min(3, n))
    config = RunConfig(protocol=protocol, num_workers=n, iterations=iterations, slowdown=slowdown,
                       compute_ms=50.0, options=options)
    return simulate(config, SimOptions(network=NET, trace=trace))


def test_allreduce_iteration_is_max_compute_plus_ring_allreduce():
    record = run("allreduce", 3, 4, slowdown="1:2x,2:3x")
    per_iteration = 0.150 + ring_allreduce_s(3, MODEL_BYTES, NET)
    assert record["wall_time_s"] == pytest.approx(4 * per_iteration)
    assert [w["compute_s"] for w in record["workers"]] == pytest.approx([0.2, 0.4, 0.6])
    assert record["heterogeneity_efficiency"] == pytest.approx(
        (3 / per_iteration) / (1 / 0.05 + 1 / 0.1 + 1 / 0.15))


@pytest.mark.parametrize("n", [3, 6, 16])
def test_homogeneous_directed_ring_dpsgd_matches_its_analytic_rate(n, tmp_path):
    # one model out, one in per worker: an iteration is compute + latency + one transfer
    edges = tmp_path / "ring.txt"
    edges.write_text("".join(f"{i} {(i + 1) % n}\n" for i in range(n)))
    iterations = 10
    record = run("dpsgd", n, iterations, topology=str(edges))
    period = 0.050 + NET.latency_s + TRANSFER_S
    assert record["wall_time_s"] == pytest.approx(iterations * period)
    assert record["samples_per_s"] == pytest.approx(n * 32 / period)


@pytest.mark.parametrize("n", [3, 6, 16])
def test_homogeneous_ring_dpsgd_rate_between_its_contention_bounds(n):
    # two models out through one egress and two in through one ingress: each iteration costs
    # latency plus 2 transfers when the arrivals interleave, 3 when they collide on an ingress
    iterations = 10
    wall = run("dpsgd", n, iterations)["wall_time_s"]
    assert iterations * (0.050 + NET.latency_s + 2 * TRANSFER_S) - 1e-12 <= wall
    assert wall <= iterations * (0.050 + NET.latency_s + 3 * TRANSFER_S) + 1e-12
    fast = RunConfig(protocol="dpsgd", num_workers=n, iterations=iterations, compute_ms=50.0)
    no_bandwidth_limit = simulate(fast, SimOptions(network=NetworkParams(100.0, 1e12)))
    assert no_bandwidth_limit["wall_time_s"] == pytest.approx(iterations * (0.050 + 100e-6), rel=1e-6)


def test_exact_trace_of_two_worker_dpsgd_with_a_straggler():
    record = run("dpsgd", 2, 2, slowdown="1:2x", trace=True)
    hop = 100e-6 + TRANSFER_S
    expected = [
        (0.0, "start", 0, 0), (0.0, "start", 1, 0),
        (0.05, "computed", 0, 0),  # worker 0's model reaches worker 1 at 0.05 + hop
        (0.1, "computed", 1, 0), (0.1, "complete", 1, (0, ((0, 0),))), (0.1, "start", 1, 1),
        (0.1 + hop, "complete", 0, (0, ((1, 0),))), (0.1 + hop, "start", 0, 1),
        (0.15 + hop, "computed", 0, 1),
        (0.2, "computed", 1, 1), (0.2, "complete", 1, (1, ((0, 1),))), (0.2, "finish", 1, 2),
        (0.2 + hop, "complete", 0, (1, ((1, 1),))), (0.2 + hop, "finish", 0, 2),
    ]
    trace = record["trace"]
    assert [(k, w, d) for _, k, w, d in trace] == [(k, w, d) for _, k, w, d in expected]
    assert [t for t, *_ in trace] == pytest.approx([t for t, *_ in expected])


def test_exact_trace_of_three_worker_allreduce():
    record = run("allreduce", 3, 2, slowdown="2:3x", trace=True)
    ar = ring_allreduce_s(3, MODEL_BYTES, NET)
    assert [(k, d) for _, k, _, d in record["trace"]] == [
        ("computed", 0), ("allreduced", 0), ("computed", 1), ("allreduced", 1)]
    assert [t for t, *_ in record["trace"]] == pytest.approx([0.0, 0.15 + ar, 0.15 + ar, 2 * (0.15 + ar)])


def test_hop_tokens_bound_the_gap_and_runs_are_deterministic():
    kw = dict(backup=1, staleness=1, max_ig=3, topology="double_ring")
    first = run("hop", 8, 40, slowdown="0:5x", trace=True, **kw)
    second = run("hop", 8, 40, slowdown="0:5x", trace=True, **kw)
    assert first["trace"] == second["trace"]
    started = {}
    for _, kind, worker, detail in first["trace"]:
        if kind == "start":
            started[worker] = detail
            assert detail - min(started.get(j, 0) for j in range(8)) <= 3 + 1
    assert first["max_iteration_gap"] <= 4


def test_time_budget_stops_every_worker_at_the_budget():
    config = RunConfig(protocol="hop", num_workers=4, time_budget_s=2.0, compute_ms=50.0, slowdown="0:5x",
                       options={"backup": 1, "topology": "complete"})
    record = simulate(config, SimOptions(network=NET))
    assert record["wall_time_s"] == pytest.approx(2.0)
    assert 0 < record["workers"][0]["iterations"] < record["workers"][1]["iterations"] <= 40
