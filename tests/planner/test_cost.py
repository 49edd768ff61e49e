"""Hand-computed costs: AccPar's re-layout table at equal halves, and a 2-layer FC example."""

import pytest

from hetrain.planner.cost import OUT, LevelCost, relayout_fractions, single_edge
from hetrain.planner.layers import Layer, chain_net
from hetrain.planner.search import Assignment, evaluate, exhaustive, solve
from hetrain.planner.shapes import Shapes

# DESIGN.md / AccPar: per side, in units of (F, E) of the boundary tensor
TABLE = {(0, 0): (0, 0), (0, 1): (0.25, 0.25), (0, 2): (0.5, 0), (1, 0): (0, 0.5), (1, 1): (0, 0.5),
         (1, 2): (0, 0), (2, 0): (0.25, 0.25), (2, 1): (0, 0), (2, 2): (0.5, 0)}


@pytest.mark.parametrize("pair", sorted(TABLE))
def test_relayout_matches_accpar_table_at_equal_halves(pair):
    prev, nxt = pair
    lc = LevelCost(0.5, 1.0, 1.0, 1.0, "volume")
    n = 100.0
    _, _, nbytes = single_edge(lc, OUT[prev], OUT[prev], nxt, n)
    f, e = TABLE[pair]
    assert nbytes == pytest.approx(2 * (f + e) * n)  # both sides receive the table's amount


def test_unequal_ratio_fractions():
    assert relayout_fractions(0, 2, 0.7) == pytest.approx((0.3, 0.7))
    assert relayout_fractions(0, 1, 0.7) == pytest.approx((0.21, 0.21))
    assert relayout_fractions(2, 0, 0.7) == (0.0, 0.0)


def _two_fc():
    return chain_net("fc2", [Layer("fc1", "linear", 4, 3), Layer("fc2", "linear", 3, 2)])


def test_two_layer_fc_by_hand():
    net, shapes = _two_fc(), None
    shapes = Shapes.full(net, 5)
    lc = LevelCost(0.5, 1.0, 1.0, 2.0, "volume")
    # (I, II): dW1 12 each side + fc2 output 5x2 each side + I->II on F2 (5x3): 1/4 (F + E) each side
    obj, seconds, nbytes = evaluate(net, shapes, lc, Assignment((0, 1)))
    assert nbytes == pytest.approx(2 * 12 + 2 * 10 + 2 * (0.25 * 15 + 0.25 * 15))
    # time: each exchange is limited by the slower side (left, 1 B/s)
    assert seconds == pytest.approx(12 + 10 + 7.5)
    # (III, I): first layer needs no input error; dW2 6 each side; III->I 1/4 (F + E) each side
    assert evaluate(net, shapes, lc, Assignment((2, 0)))[2] == pytest.approx(2 * 6 + 2 * 7.5)
    # data parallel: the two weight gradients only
    assert evaluate(net, shapes, lc, Assignment((0, 0)))[2] == pytest.approx(2 * (12 + 6))
    best, value = solve(net, shapes, lc)
    assert value == pytest.approx(exhaustive(net, shapes, lc)[1])
    assert value <= 2 * (12 + 6)


def test_batch_one_prefers_model_parallel_for_big_fc():
    net = chain_net("big", [Layer("a", "linear", 4096, 4096), Layer("b", "linear", 4096, 4096)])
    asg, _ = solve(net, Shapes.full(net, 1), LevelCost(0.5, 2.0, 1e9, 1e9, "volume"))
    assert 0 not in asg.types


def test_types_restriction_is_respected():
    net = _two_fc()
    asg, _ = solve(net, Shapes.full(net, 1), LevelCost(0.5, 2.0, 1.0, 1.0, "volume"), allowed=(0, 1))
    assert set(asg.types) <= {0, 1}
