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
