"""The DP agrees with brute force over all type sequences under the same cost model."""

from hypothesis import given, settings
from hypothesis import strategies as st

from hetrain.planner.cost import LevelCost
from hetrain.planner.layers import Layer, Net, Node, chain_net
from hetrain.planner.search import evaluate, exhaustive, solve
from hetrain.planner.shapes import Shapes

dims = st.sampled_from([1, 3, 16, 64, 256, 1000, 4096])
levels = st.builds(LevelCost, st.floats(0.05, 0.95), st.sampled_from([1.0, 2.0, 4.0]),
                   st.floats(1e3, 1e12), st.floats(1e3, 1e12), st.sampled_from(["time", "volume"]))


def _close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(dims, st.sampled_from([1, 9]), st.sampled_from([1, 49, 196])), min_size=1, max_size=10),
       dims, st.sampled_from([1, 8, 256]), levels, st.sampled_from([(0, 1, 2), (0, 1)]))
def test_chain_dp_equals_exhaustive(spec, d0, batch, lc, allowed):
    layers, d_in = [], d0
    for i, (d_out, kernel, hw) in enumerate(spec):
        layers.append(Layer(f"l{i}", "conv" if kernel > 1 else "linear", d_in, d_out, kernel, hw, hw))
        d_in = d_out
    net = chain_net("random", layers)
    shapes = Shapes.full(net, batch)
    asg, value = solve(net, shapes, lc, allowed)
    _, ref = exhaustive(net, shapes, lc, allowed)
    assert _close(value, ref)
    assert _close(evaluate(net, shapes, lc, asg)[0], value)
    assert set(asg.types) <= set(allowed)


@settings(max_examples=25, deadline=None)
@given(st.lists(dims, min_size=6, max_size=6), st.booleans(), st.booleans(), st.sampled_from([1, 32, 512]), levels)
def test_residual_dp_equals_exhaustive(widths, identity, stem, batch, lc):
    """stem? -> [a1 -> a2] + (shortcut layer | identity) -> head: joins costed exactly."""
    w = widths
    layers = [Layer("stem", "linear", w[0], w[1]), Layer("a1", "linear", w[1], w[2]),
              Layer("a2", "linear", w[2], w[1] if identity else w[3])]
    nodes = [Node("layer", 0, (-1,)), Node("layer", 1, (0,)), Node("layer", 2, (1,))]
    if identity:
        nodes.append(Node("add", 0, (2, 0)))
    else:
        layers.append(Layer("short", "linear", w[1], w[3]))
        nodes += [Node("layer", 3, (0,)), Node("add", 0, (2, 3))]
    layers.append(Layer("head", "linear", w[1] if identity else w[3], w[4]))
    nodes.append(Node("layer", len(layers) - 1, (len(nodes) - 1,)))
    if not stem:  # the fork is the network input itself
        layers, nodes = layers[1:], [Node(n.kind, n.index - (n.kind == "layer"),
                                          tuple(p - 1 for p in n.producers) if n.producers != (-1,) else (-1,))
                                     for n in nodes[1:]]
        nodes = [Node(n.kind, n.index, tuple(max(p, -1) for p in n.producers)) for n in nodes]
    net = Net("res", layers, nodes)
    shapes = Shapes.full(net, batch)
    asg, value = solve(net, shapes, lc)
    _, ref = exhaustive(net, shapes, lc)
    assert _close(value, ref)
    assert _close(evaluate(net, shapes, lc, asg)[0], value)


def test_ten_layer_chain_dp_equals_exhaustive():
    widths = [3, 64, 64, 128, 128, 256, 256, 4096, 4096, 1000, 10]
    layers = [Layer(f"l{i}", "linear", a, b) for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]))]
    net = chain_net("ten", layers)
    for batch, alpha in ((32, 0.5), (1, 0.7)):
        lc = LevelCost(alpha, 2.0, 1e9, 3e9, "time")
        shapes = Shapes.full(net, batch)
        assert _close(solve(net, shapes, lc)[1], exhaustive(net, shapes, lc)[1])


@settings(max_examples=30, deadline=None)
@given(st.lists(dims, min_size=6, max_size=6), st.sampled_from([1, 32, 512]), levels, st.integers(2, 12))
def test_alternatives_are_exact_and_ranked(widths, batch, lc, k):
    """Each alternative's claimed cost is its exact cost; the optimum comes first; all are distinct."""
    from hetrain.planner.alternatives import alternatives

    w = widths
    layers = [Layer("stem", "linear", w[0], w[1]), Layer("a1", "linear", w[1], w[2]), Layer("a2", "linear", w[2], w[1]),
              Layer("short", "linear", w[1], w[1]), Layer("head", "linear", w[1], w[3])]
    nodes = [Node("layer", 0, (-1,)), Node("layer", 1, (0,)), Node("layer", 2, (1,)), Node("layer", 3, (0,)),
             Node("add", 0, (2, 3)), Node("layer", 4, (4,))]
    net = Net("res", layers, nodes)
    shapes = Shapes.full(net, batch)
    alts = alternatives(net, shapes, lc, k=k)
    assert alts[0] == solve(net, shapes, lc) and 1 <= len(alts) <= k
    assert len({a for a, _ in alts}) == len(alts)
    costs = [c for _, c in alts]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(costs, costs[1:]))  # ranked (up to rounding)
    for asg, cost in alts:
        assert _close(evaluate(net, shapes, lc, asg)[0], cost)


@settings(max_examples=40, deadline=None)
@given(st.lists(dims, min_size=6, max_size=6), st.sampled_from([1, 32, 512]), levels,
       st.lists(st.sampled_from([0, 1, 2]), min_size=5, max_size=5), st.booleans())
def test_fixed_assignment_is_what_the_dp_finds(widths, batch, lc, fixed, residual):
    """The shortcut for fixed-type baselines: data parallelism with joins, any fixed types on a chain."""
    from hetrain.planner.search import allowed_mask, fixed_assignment

    w = widths
    if residual:
        layers = [Layer("stem", "linear", w[0], w[1]), Layer("a1", "linear", w[1], w[2]),
                  Layer("a2", "linear", w[2], w[1]), Layer("short", "linear", w[1], w[1]),
                  Layer("head", "linear", w[1], w[3])]
        nodes = [Node("layer", 0, (-1,)), Node("layer", 1, (0,)), Node("layer", 2, (1,)), Node("layer", 3, (0,)),
                 Node("add", 0, (2, 3)), Node("layer", 4, (4,))]
        net, fixed = Net("res", layers, nodes), [0] * 5
    else:
        net = chain_net("chain", [Layer(f"l{i}", "linear", a, b) for i, (a, b) in enumerate(zip(w[:-1], w[1:]))])
    mask = allowed_mask([(t,) for t in fixed], len(net.layers))
    shortcut = fixed_assignment(net, mask)
    assert shortcut is not None and shortcut == solve(net, Shapes.full(net, batch), lc, mask)[0]
