"""The vectorised tables and evaluator give the scalar reference's floats, bit for bit."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrain.planner.cost import NEED, LevelCost, backward_accumulate, forward_fanout
from hetrain.planner.evaluate import evaluate, evaluate_reference
from hetrain.planner.layers import Layer, Net, Node
from hetrain.planner.models import load
from hetrain.planner.search import Assignment, solve
from hetrain.planner.shapes import Shapes
from hetrain.planner.tables import NSTATE, Tables

levels = st.builds(LevelCost, st.floats(0.05, 0.95), st.sampled_from([1.0, 2.0, 4.0]),
                   st.floats(1e3, 1e12), st.floats(1e3, 1e12), st.sampled_from(["time", "volume"]))
sizes = st.floats(1.0, 1e9)


@settings(max_examples=60, deadline=None)
@given(levels, sizes, sizes, st.sampled_from(["layer", "identity"]))
def test_fork_table_equals_scalar_code(lc, size_a, size_b, other):
    table = Tables(lc).fork_table(size_a, other, size_b)
    for a0 in range(3):
        for bc in range(3 if other == "layer" else 9):
            fl, bl = (NEED[bc], NEED[bc]) if other == "layer" else (bc // 3, bc % 3)
            for s in range(NSTATE):
                fw = forward_fanout(lc, s // 4, [(NEED[a0], size_a), (fl, size_b)])[0]
                bw = backward_accumulate(lc, [(NEED[a0], size_a), (bl, size_b)], s % 4)[0]
                assert table[s, a0, bc] == fw + bw


def _residual(widths):
    w = widths
    layers = [Layer("stem", "linear", w[0], w[1]), Layer("a1", "conv", w[1], w[2], 9, 49, 49),
              Layer("a2", "linear", w[2], w[1]), Layer("b1", "linear", w[1], w[3]), Layer("b2", "linear", w[3], w[1]),
              Layer("short", "linear", w[1], w[1]), Layer("head", "linear", w[1], w[4])]
    nodes = [Node("layer", 0, (-1,)), Node("layer", 1, (0,)), Node("layer", 2, (1,)), Node("add", 0, (2, 0)),
             Node("layer", 3, (3,)), Node("layer", 4, (4,)), Node("layer", 5, (3,)), Node("add", 1, (5, 6)),
             Node("layer", 6, (7,))]
    return Net("res", layers, nodes)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([3, 16, 64, 1000, 4096]), min_size=5, max_size=5), st.sampled_from([1, 32, 512]),
       levels, st.randoms(use_true_random=False))
def test_evaluate_equals_reference(widths, batch, lc, rnd):
    net = _residual(widths)
    shapes = Shapes.full(net, batch).split([rnd.randrange(3) for _ in net.layers], 0.37)
    asg = Assignment(tuple(rnd.randrange(3) for _ in net.layers),
                     tuple((rnd.randrange(3), rnd.randrange(3)) for _ in range(net.num_adds)))
    assert evaluate(net, shapes, lc, asg) == evaluate_reference(net, shapes, lc, asg)


def test_evaluate_equals_reference_on_zoo_plans():
    for name in ("resnet-50", "transformer", "vgg-a"):
        net = load(name)
        lc = LevelCost(0.61, 2.0, 3e11, 1e11, "time")
        shapes = Shapes.full(net, 64)
        asg, value = solve(net, shapes, lc)
        assert evaluate(net, shapes, lc, asg) == evaluate_reference(net, shapes, lc, asg)
        assert np.isclose(evaluate(net, shapes, lc, asg)[0], value, rtol=1e-12)
