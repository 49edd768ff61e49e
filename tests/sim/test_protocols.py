"""Every protocol simulates, deterministically, with its decisions from the shared pure code."""

import pytest

from hetrain.config import RunConfig
from hetrain.sim import simulate
from hetrain.slowdown import parse_slowdown

CASES = [
    ("allreduce", {}), ("dpsgd", {}), ("hop", {"backup": 1, "topology": "double_ring", "skip_threshold": 2}),
    ("prague", {"gg": "random"}), ("prague", {"gg": "buffer"}), ("prague", {"gg": "division"}),
    ("prague", {"gg": "static"}), ("prague", {"gg": "smart"}), ("prague", {"gg": "smart", "preduce_overlap": 0}),
    ("adpsgd", {}), ("ps", {}),
    ("ps", {"staleness": 2}),
]


@pytest.mark.parametrize("protocol, flags", CASES)
def test_every_protocol_finishes_its_iterations_deterministically(protocol, flags):
    config = RunConfig(protocol=protocol, num_workers=8, iterations=12, slowdown="0:5x", compute_ms=50.0,
                       seed=3, options=flags)
    first, second = simulate(config), simulate(config)
    for record in (first, second):
        record.pop("sim_runtime_s"), record.pop("events_per_s")
    assert first == second
    assert first["wall_time_s"] > 0
    for w in first["workers"]:
        assert w["iterations"] + w.get("skipped_iterations", 0) == 12
        assert w["compute_s"] + w["wait_s"] == pytest.approx(w["finish_s"])


def test_prague_smart_beats_allreduce_under_a_straggler():
    base = RunConfig(num_workers=8, time_budget_s=5.0, slowdown="0:5x", compute_ms=50.0)
    allreduce = simulate(base.replace(protocol="allreduce"))["heterogeneity_efficiency"]
    prague = simulate(base.replace(protocol="prague", options={"gg": "smart"}))["heterogeneity_efficiency"]
    assert allreduce == pytest.approx(8 / 5 / (7 + 1 / 5), rel=0.02)  # about 0.22
    assert prague > 2 * allreduce


def test_every_slowdown_spec_slows_one_worker_in_n():
    slowdown = parse_slowdown("every:8:5x")
    assert [w for w in range(20) if slowdown.factor(w, 0) == 5.0] == [0, 8, 16]


def test_prague_asking_before_the_compute_ends_hides_the_group_generators_round_trip():
    from hetrain.sim.network import NetworkParams
    from hetrain.sim.runner import SimOptions

    base = RunConfig(protocol="prague", num_workers=8, iterations=200, compute_ms=50.0, seed=1)
    slow_link = SimOptions(network=NetworkParams(latency_us=2000.0))
    after = simulate(base.replace(options={"gg_prefetch_ms": 0.0}), slow_link)
    before = simulate(base.replace(options={"gg_prefetch_ms": 5.0}), slow_link)
    for record in (after, before):
        assert all(w["iterations"] == 200 for w in record["workers"])
    # two 2 ms messages per iteration are in the critical path only when asking after the compute
    assert after["heterogeneity_efficiency"] < 0.95
    assert before["heterogeneity_efficiency"] > after["heterogeneity_efficiency"] + 0.03


@pytest.mark.slow  # CI time (9 s)
def test_prague_with_sharded_generators_relieves_a_saturated_group_generator():
    # 1,024 workers asking every 5 ms: one generator (20 us a request) is busy 4x over; 8 shards share it
    base = RunConfig(protocol="prague", num_workers=1024, time_budget_s=0.5, compute_ms=5.0, slowdown="every:8:5x")
    one = simulate(base.replace(options={"gg_shards": 1}))
    eight = simulate(base.replace(options={"gg_shards": 8, "gg_epoch_s": 0.1}))
    assert one["heterogeneity_efficiency"] < 0.35
    assert eight["heterogeneity_efficiency"] > 1.5 * one["heterogeneity_efficiency"]
    assert eight["gg_shards"] == 8


def test_the_group_generators_service_time_is_a_simulator_setting():
    from hetrain.sim.network import NetworkParams
    from hetrain.sim.runner import SimOptions

    config = RunConfig(protocol="prague", num_workers=256, time_budget_s=0.5, compute_ms=5.0)
    fast = simulate(config, SimOptions(network=NetworkParams(gg_service_us=5.0)))
    slow = simulate(config, SimOptions(network=NetworkParams(gg_service_us=200.0)))  # 256 x 200/s x 200 us = 10x busy
    assert slow["network"]["gg_service_us"] == 200.0
    assert slow["heterogeneity_efficiency"] < 0.5 * fast["heterogeneity_efficiency"]


def test_prague_overlapping_its_preduces_hides_them_and_still_learns():
    from hetrain.sim.network import NetworkParams
    from hetrain.sim.runner import SimOptions

    base = RunConfig(protocol="prague", num_workers=8, time_budget_s=20.0, compute_ms=50.0, slowdown="0:5x",
                     seed=1, options={"gg_prefetch_ms": 0.0, "preduce_overlap": 0})
    slow_link = SimOptions(network=NetworkParams(latency_us=2000.0), math="digits")
    blocking = simulate(base, slow_link)
    overlapped = simulate(base.replace(options={"gg_prefetch_ms": 0.0, "preduce_overlap": 1}), slow_link)
    # the request and the P-Reduce (2 ms messages each) leave the critical path: only the request remains
    assert overlapped["heterogeneity_efficiency"] > blocking["heterogeneity_efficiency"] + 0.02
    assert overlapped["final_accuracy_avg_model"] > 0.9


def test_a_simulated_hop_skip_hands_out_the_averaged_model():
    """As the runtime does (docs/decisions/a-skip-hands-out-the-model.md): after a skip from k to j
    the worker sends its model tagged j - 1 to its out-neighbours, who may be waiting for it."""
    from hetrain.protocols.hop_config import HopOptions
    from hetrain.sim.common import SimSetup
    from hetrain.sim.engine import Engine
    from hetrain.sim.hop_sim import HopSim
    from hetrain.sim.math_model import NullMath
    from hetrain.sim.network import Network, NetworkParams

    engine = Engine(trace=True)
    setup = SimSetup(4, 60, 0.01, parse_slowdown("0:5x"), 4e6, engine, Network(NetworkParams(), 4), NullMath())
    sim = HopSim(setup, HopOptions())
    sent = []
    arrive = sim._update_arrives
    sim._update_arrives = lambda dst, src, k, payload: (sent.append((src, dst, k)), arrive(dst, src, k, payload))
    sim.run()
    skips = [detail for (_, kind, worker, detail) in engine.trace if kind == "skip" and worker == 0]
    assert len(skips) >= 5  # the 5x slower worker skips
    for _, to_iteration in skips:
        assert {dst for src, dst, k in sent if src == 0 and k == to_iteration - 1} == set(sim.workers[0].out_neighbors)
