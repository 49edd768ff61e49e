"""Partitioned execution of plans (types I/II/III, unequal ratios, residual joins, convolutions) on gloo.

Each rank multiplies only its boxes and moves what the plan's layouts say must
move; outputs and weight gradients must equal the unpartitioned step (float64).
"""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrain.jobs.local_job import run_local
from hetrain.planner.boxes import Layout, area, fetch_plan, intersect, reduce_plan, subtract
from hetrain.planner.devices import parse_array
from hetrain.planner.execute import Program
from hetrain.planner.hierarchy import GroupPlan, PlanConfig, plan
from hetrain.planner.layers import Layer, Net, Node
from hetrain.planner.measure_worker import check_worker
from hetrain.planner.search import Assignment


def tiny_resnet():
    """conv stem, an identity block, a strided block with a projection shortcut, a linear head."""
    layers = [Layer("stem", "conv", 3, 8, 9, 64, 64), Layer("b1a", "conv", 8, 8, 9, 64, 64),
              Layer("b1b", "conv", 8, 8, 9, 64, 64), Layer("b2a", "conv", 8, 16, 9, 64, 16),
              Layer("b2b", "conv", 16, 16, 9, 16, 16), Layer("b2s", "conv", 8, 16, 1, 64, 16),
              Layer("fc", "linear", 64, 10)]
    nodes = [Node("layer", 0, (-1,)), Node("layer", 1, (0,)), Node("layer", 2, (1,)), Node("add", 0, (2, 0)),
             Node("layer", 3, (3,)), Node("layer", 4, (4,)), Node("layer", 5, (3,)), Node("add", 1, (5, 6)),
             Node("layer", 6, (7,))]
    return Net("tiny-resnet", layers, nodes)


def random_tree(net, depth, rnd):
    if depth == 0:
        return GroupPlan("d", 1, 0, 0, 0, 0, 0)
    asg = Assignment(tuple(rnd.randrange(3) for _ in net.layers),
                     tuple((rnd.randrange(3), rnd.randrange(3)) for _ in range(net.num_adds)))
    return GroupPlan("g", 2**depth, 0, 0, 0, 0, 0, alpha=rnd.choice([0.5, 0.3, 0.65]), assignment=asg,
                     left=random_tree(net, depth - 1, rnd), right=random_tree(net, depth - 1, rnd))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from([1, 2, 3]))
def test_compute_boxes_tile_every_layer(seed, depth):
    net = tiny_resnet()
    layout = Layout(net, 6, random_tree(net, depth, random.Random(seed)))
    assert layout.world == 2**depth
    for i, la in enumerate(net.layers):
        boxes = [layout.compute[r][i] for r in range(layout.world)]
        vol = sum((b1 - b0) * (i1 - i0) * (o1 - o0) for (b0, b1), (i0, i1), (o0, o1) in boxes)
        assert vol == 6 * la.d_in * la.d_out


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6))
def test_fetch_and_reduce_plans_cover_what_is_needed(seed):
    rnd = random.Random(seed)
    net = tiny_resnet()
    layout = Layout(net, 6, random_tree(net, 2, rnd))

    def box():
        r0, c0 = rnd.randrange(6), rnd.randrange(8)
        return (r0, rnd.randrange(r0 + 1, 7), c0, rnd.randrange(c0 + 1, 9))

    held = [box() for _ in range(4)]
    held[rnd.randrange(4)] = (0, 6, 0, 8)  # someone holds everything
    need = [box() for _ in range(4)]
    for dst in range(4):
        got = [t.box for t in fetch_plan(layout, held, need) if t.dst == dst]
        assert sum(area(b) for b in got) + area(intersect(held[dst], need[dst]) or (0, 0, 0, 0)) == area(need[dst])
        assert all(intersect(b, held[dst]) is None for b in got)
    for t in reduce_plan(layout, held, need):
        assert t.box == intersect(held[t.src], need[t.dst]) and t.src != t.dst
        assert t.level == layout.level(t.src, t.dst)
    assert sum(area(b) for b in subtract((0, 6, 0, 8), (1, 3, 2, 5))) == 48 - 6


@pytest.mark.timeout(180)
def test_partitioned_steps_equal_the_unpartitioned_one(processes):
    net = tiny_resnet()
    rnd = random.Random(7)
    programs = [Program(net, 6, random_tree(net, 1, rnd)) for _ in range(4)]
    planned = plan(net, 6, parse_array("tpu-v3:1,tpu-v2:1"), PlanConfig(bytes_per_elem=8.0))
    programs.append(Program(net, 6, planned))
    results = run_local(check_worker, 2, (programs,), backend="gloo", timeout_s=60, job_timeout_s=150)
    for k in range(len(programs)):
        out_err = max(r[k][0] for r in results)
        grad_err = max(r[k][1] for r in results)
        assert out_err < 1e-12 and grad_err < 1e-12, (k, out_err, grad_err)
        assert max(r[k][2] for r in results) > 0.1  # gradients are not all zero


@pytest.mark.timeout(240)
def test_two_levels_on_four_processes(processes):
    net = tiny_resnet()
    rnd = random.Random(11)
    programs = [Program(net, 6, random_tree(net, 2, rnd)) for _ in range(2)]
    results = run_local(check_worker, 4, (programs,), backend="gloo", timeout_s=90, job_timeout_s=200)
    for k in range(len(programs)):
        assert max(r[k][0] for r in results) < 1e-12 and max(r[k][1] for r in results) < 1e-12


def test_program_gives_each_rank_its_compute_boxes():
    net = tiny_resnet()
    program = Program(net, 6, random_tree(net, 2, random.Random(3)))
    layout = program.layout
    for i in range(len(net.layers)):
        for r in range(layout.world):
            (b0, b1), (i0, i1), (o0, o1) = layout.compute[r][i]
            assert program.input_box(i, r) == (b0, b1, i0, i1)
            assert program.output_box(i, r) == (b0, b1, o0, o1)
            assert program.weight_box(i, r) == (i0, i1, o0, o1)
    for a in range(net.num_adds):
        for r in range(layout.world):
            assert program.join_box(a, r) == layout.join_fwd[r][a]
            assert program.join_box(a, r, forward=False) == layout.join_err[r][a]
