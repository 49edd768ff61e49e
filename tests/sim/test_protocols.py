"""Every protocol simulates, deterministically, with its decisions from the shared pure code."""

import pytest

from hetrain.config import RunConfig
from hetrain.sim import simulate
from hetrain.slowdown import parse_slowdown

CASES = [
    ("allreduce", {}), ("dpsgd", {}), ("hop", {"backup": 1, "topology": "double_ring", "skip_threshold": 2}),
    ("prague", {"gg": "random"}), ("prague", {"gg": "buffer"}), ("prague", {"gg": "division"}),
    ("prague", {"gg": "static"}), ("prague", {"gg": "smart"}), ("adpsgd", {}), ("ps", {}),
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
