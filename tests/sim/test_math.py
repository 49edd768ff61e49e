"""--math digits: real models learn, and the protocols' averaging changes what they learn."""

import numpy as np
import pytest

from hetrain.config import RunConfig
from hetrain.sim import SimOptions, simulate
from hetrain.sim.math_model import DIGITS_PARAMS, DigitsMath

DIGITS = SimOptions(math="digits")


def test_gradient_matches_finite_differences():
    math = DigitsMath(1, batch_size=8, seed=1)
    xb, yb = math.batch(0)
    flat = math.params[0].astype(np.float64)
    grad = math.gradient(flat, xb, yb)

    def loss(p):
        w1, b1, w2, b2 = math._unpack(p)
        logits = np.maximum(xb @ w1 + b1, 0) @ w2 + b2
        logits = logits - logits.max(1, keepdims=True)
        return float(np.mean(np.log(np.exp(logits).sum(1)) - logits[np.arange(len(yb)), yb]))

    for index in np.random.default_rng(0).integers(0, DIGITS_PARAMS, 12):
        step = np.zeros_like(flat)
        step[index] = 1e-5
        assert grad[index] == pytest.approx((loss(flat + step) - loss(flat - step)) / 2e-5, abs=1e-5)


@pytest.mark.parametrize("protocol", ["allreduce", "dpsgd", "prague", "ps"])
def test_simulated_workers_learn_digits(protocol):
    config = RunConfig(protocol=protocol, num_workers=4, iterations=150, compute_ms=10.0, seed=0)
    record = simulate(config, DIGITS)
    assert record["final_accuracy_avg_model"] > 0.85
    assert record["final_accuracy_worst_worker"] > 0.7
    assert record["accuracy_curve"] and record["consensus_distance"] is not None
    if protocol == "allreduce":
        assert record["consensus_distance"] == 0.0


def test_averaging_keeps_workers_close_and_skipping_partial_averaging_spreads_them():
    base = RunConfig(num_workers=8, iterations=60, compute_ms=10.0, slowdown="0:5x", seed=0)
    dpsgd = simulate(base.replace(protocol="dpsgd", options={"topology": "complete"}), DIGITS)
    hop = simulate(base.replace(protocol="hop", options={"topology": "complete", "backup": 3, "staleness": 2}), DIGITS)
    assert dpsgd["consensus_distance"] < 1e-5  # complete graph, uniform weights: exact consensus
    assert hop["consensus_distance"] > dpsgd["consensus_distance"]
    assert hop["updates_stale"] + hop["updates_dropped"] > 0
