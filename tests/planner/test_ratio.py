"""The split ratio: 0.5 for equal halves, k/(k+1) when one half is k times faster and talking is free."""

import math

import pytest

from hetrain.planner.baselines import searched
from hetrain.planner.devices import Device, parse_array
from hetrain.planner.hierarchy import plan
from hetrain.planner.layers import Layer, chain_net
from hetrain.planner.ratio import balance

NET = chain_net("mlp", [Layer("a", "linear", 512, 1024), Layer("b", "linear", 1024, 10)])


def test_equal_devices_split_half():
    p = plan(NET, 64, parse_array("v100:4"), searched())
    assert p.alpha == 0.5 and p.left.alpha == 0.5


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_k_times_faster_without_communication(k):
    fast = Device("fast", k * 1e12, 1e9, math.inf)
    slow = Device("slow", 1e12, 1e9, math.inf)
    p = plan(NET, 64, [fast, slow], searched())
    assert p.alpha == pytest.approx(k / (k + 1), abs=1e-3)
    assert p.left.step_s == pytest.approx(p.right.step_s, rel=1e-3)


def test_balance_finds_root_and_clamps():
    alpha, trials = balance(lambda a: a - 0.3, 0.9)
    assert alpha == pytest.approx(0.3, abs=1e-4) and trials < 40
    assert balance(lambda a: 1.0, 0.5)[0] < 0.01  # left always slower: give it (almost) nothing


def test_heterogeneous_array_gives_faster_half_more():
    p = plan(NET, 64, parse_array("tpu-v3:2,tpu-v2:2"), searched())
    assert 0.5 < p.alpha < 0.95
    assert p.left.step_s == pytest.approx(p.right.step_s, rel=1e-2)


def test_newton_steps_land_on_a_linear_gap_in_two_trials():
    alpha, trials = balance(lambda a: 3.0 * a - 0.9, 0.8, slope=lambda a, gap: 3.0)
    assert alpha == pytest.approx(0.3, abs=1e-12) and trials == 2


def test_a_jump_in_the_gap_ends_in_a_narrow_bracket():
    def gap(a):  # the DP switches types at 0.41: the gap jumps over zero there
        return a - 0.5 if a < 0.41 else a - 0.3

    alpha, trials = balance(gap, 0.9, slope=lambda a, g: 1.0)
    assert abs(alpha - 0.41) <= 1e-4 and trials < 40


def test_an_end_that_keeps_the_sign_is_the_answer():
    alpha, trials = balance(lambda a: a - 2.0, 0.5, slope=lambda a, gap: 1.0)
    assert alpha == pytest.approx(1 - 1e-3) and trials == 2


def test_a_slope_that_is_not_positive_falls_back_to_stepping():
    alpha, _ = balance(lambda a: a - 0.3, 0.9, slope=lambda a, gap: 0.0)
    assert alpha == pytest.approx(0.3, abs=1e-4)


def test_unequal_halves_are_balanced_to_the_root():
    p = plan(NET, 64, parse_array("tpu-v3:2,tpu-v2:2"), searched())
    assert p.left.step_s == pytest.approx(p.right.step_s, rel=1e-9)


def test_the_ratio_searches_spend_few_trials_on_a_large_heterogeneous_array():
    """Each trial plans both 512-device halves (19 DPs); the counts are the speed (docs/guides/planner.md)."""
    from hetrain.planner.baselines import compare
    from hetrain.planner.models import load

    plans = compare(load("resnet-152"), 512, parse_array("tpu-v3:512,tpu-v2:512"))
    trials = {name: p.ratio_trials for name, p in plans.items()}
    assert trials == {"plan": 3, "data-parallel": 2, "one-weird-trick": 1, "hypar": 1}
    assert plans["plan"].left.step_s == pytest.approx(plans["plan"].right.step_s, rel=1e-9)
    assert plans["one-weird-trick"].alpha == plans["data-parallel"].alpha == pytest.approx(1 - 1e-3)
