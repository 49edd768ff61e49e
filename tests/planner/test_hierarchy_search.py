"""Search across levels and the memory constraint, against brute force over whole hierarchies.

The reference enumerates every type assignment at every level of a small chain
on 4 equal devices (2 levels: 3^n assignments at the top, 3^n in each half) and
keeps, among the plans whose every device fits its memory, the one with the
lowest objective (step time, or bytes for the volume objective).
"""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrain.planner.cost import LevelCost
from hetrain.planner.devices import Device
from hetrain.planner.evaluate import evaluate
from hetrain.planner.hierarchy import PlanConfig, plan
from hetrain.planner.layers import Layer, chain_net
from hetrain.planner.memory import NoFit, need_bytes
from hetrain.planner.search import Assignment
from hetrain.planner.shapes import Shapes

dims = st.sampled_from([8, 64, 512, 4096])


def _net(widths, kernels):
    layers = [Layer(f"l{i}", "conv" if k > 1 else "linear", a, b, k, 49 if k > 1 else 1, 49 if k > 1 else 1)
              for i, (a, b, k) in enumerate(zip(widths[:-1], widths[1:], kernels))]
    return chain_net("chain", layers)


def brute_force(net, batch, dev, cfg, levels=2):
    """(objective, fits) of the best plan on 2**levels equal devices, over every assignment everywhere."""
    n = len(net.layers)
    bw = {k: dev.link_bytes_per_s * 2 ** (levels - k - 1) for k in range(levels)}

    def best(shapes, depth):
        if depth == levels:
            need = need_bytes(shapes, net, cfg.bytes_per_elem, cfg.state_bytes)
            compute = shapes.train_flops(net) / dev.flops_per_s
            return (0.0 if need <= dev.memory_bytes else math.inf, compute if cfg.objective == "time" else 0.0)
        lc = LevelCost(0.5, cfg.bytes_per_elem, bw[depth], bw[depth], cfg.objective)
        out = (math.inf, math.inf)
        for types in itertools.product(cfg.allowed, repeat=n):
            _, seconds, nbytes = evaluate(net, shapes, lc, Assignment(types))
            over, obj = best(shapes.split(types, 0.5), depth + 1)  # both halves are the same problem
            total = obj + seconds if cfg.objective == "time" else 2 * obj + nbytes
            out = min(out, (over, total))
        return out

    over, obj = best(Shapes.full(net, batch), 0)
    return obj, over == 0.0


def _close_or_below(a, b):
    return a <= b * (1 + 1e-9) + 1e-30


configs = st.builds(dict, objective=st.sampled_from(["time", "volume"]), allowed=st.sampled_from([(0, 1, 2), (0, 1)]),
                    bytes_per_elem=st.sampled_from([2.0, 4.0]))


@settings(max_examples=25, deadline=None)
@given(st.lists(dims, min_size=3, max_size=4), st.lists(st.sampled_from([1, 9]), min_size=3, max_size=3),
       st.sampled_from([1, 16, 256]), configs, st.integers(1, 4))
def test_lookahead_between_brute_force_and_greedy(widths, kernels, batch, cfg, width):
    net = _net(widths, kernels[:len(widths) - 1])
    dev = Device("d", 1e13, 1e15, 1e10)
    greedy = plan(net, batch, [dev] * 4, PlanConfig(**cfg))
    look = plan(net, batch, [dev] * 4, PlanConfig(**cfg, search="lookahead", width=width))
    deep = plan(net, batch, [dev] * 4, PlanConfig(**cfg, search="lookahead", width=width, depth=2))
    ref, _ = brute_force(net, batch, dev, PlanConfig(**cfg))
    assert _close_or_below(ref, look.objective) and _close_or_below(ref, deep.objective)
    assert _close_or_below(look.objective, greedy.objective)
    assert _close_or_below(deep.objective, greedy.objective)


@settings(max_examples=25, deadline=None)
@given(st.lists(dims, min_size=3, max_size=4), st.lists(st.sampled_from([1, 9]), min_size=3, max_size=3),
       st.sampled_from([1, 16, 256]), configs, st.floats(0.0, 1.0), st.sampled_from(["greedy", "lookahead"]))
def test_memory_constraint_against_brute_force(widths, kernels, batch, cfg, where, search):
    """A plan that fits is found exactly when one exists; it fits, and is no better than the best that fits."""
    net = _net(widths, kernels[:len(widths) - 1])
    shapes = Shapes.full(net, batch)
    # capacities between "everything split four ways" and "nothing split"
    all_split = shapes.split([1] * len(net.layers), 0.5).split([1] * len(net.layers), 0.5)
    lo, hi = need_bytes(all_split, net, cfg["bytes_per_elem"], 0.0), need_bytes(shapes, net, cfg["bytes_per_elem"], 0.0)
    dev = Device("d", 1e13, lo * 0.9 + (hi * 1.1 - lo * 0.9) * where, 1e10)
    config = PlanConfig(**cfg, search=search, fit_memory=True)
    ref, possible = brute_force(net, batch, dev, config)
    if not possible:
        with pytest.raises(NoFit, match="short by"):
            plan(net, batch, [dev] * 4, config)
        return
    got = plan(net, batch, [dev] * 4, config)
    assert got.fits and got.worst.need <= dev.memory_bytes
    assert _close_or_below(ref, got.objective)


def test_unequal_halves_move_the_ratio_to_fit():
    """A fast device with little memory beside a slow one with plenty: the balanced ratio would overflow it."""
    net = chain_net("mlp", [Layer("a", "linear", 1024, 4096), Layer("b", "linear", 4096, 1024)])
    fast, slow = Device("fast", 8e12, 5e7, 1e10), Device("slow", 1e12, 1e10, 1e10)
    free = plan(net, 4096, [fast, slow], PlanConfig())
    assert free.left.worst.over > 0  # balanced: the fast side takes ~8/9 of the batch and overflows
    fitted = plan(net, 4096, [fast, slow], PlanConfig(fit_memory=True))
    assert fitted.fits and fitted.left.worst.over <= 0 and fitted.right.worst.over <= 0
    assert fitted.alpha < free.alpha
    assert fitted.step_s >= free.step_s


def test_nothing_fits_is_one_line_with_the_shortfall():
    net = chain_net("mlp", [Layer("a", "linear", 4096, 4096), Layer("b", "linear", 4096, 4096)])
    tiny = Device("tiny", 1e12, 1e6, 1e10)
    with pytest.raises(NoFit) as err:
        plan(net, 64, [tiny] * 4, PlanConfig(fit_memory=True, optimizer="adam", state_bytes=4.0))
    text = str(err.value)
    assert len(text.splitlines()) == 1 and "short by" in text and "tiny" in text
