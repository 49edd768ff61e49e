"""Training with a plan (issue 42): the hierarchical reductions, the shards, biases and loss, the CLI.

Mutations each test is there to catch (tests/mutants/catalog.py, run by tests/mutants/test_mutants.py):
``plan-shards-frozen`` (the optimizer never updates a shard: accuracy stays at chance),
``plan-bias-on-every-rank`` (every rank adds its bias to its partial outputs: the check against the
unpartitioned model fails), ``plan-flat-reductions`` (every contribution sent to every holder: the
top level moves more bytes than the cost model counts).
"""

import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrain.planner.boxes import Layout, allreduce_rounds, area
from hetrain.planner.hierarchy import GroupPlan
from hetrain.planner.layers import Layer, Net, Node
from hetrain.planner.search import Assignment


def _net():
    return Net("t", [Layer("a", "linear", 6, 8), Layer("b", "linear", 8, 5)],
               [Node("layer", 0, (-1,)), Node("layer", 1, (0,))])


def _tree(net, depth, rnd, types=None):
    if depth == 0:
        return GroupPlan("d", 1, 0, 0, 0, 0, 0)
    kinds = types or tuple(rnd.randrange(3) for _ in net.layers)
    return GroupPlan("g", 2**depth, 0, 0, 0, 0, 0, alpha=rnd.choice([0.5, 0.3, 0.7]), assignment=Assignment(kinds),
                     left=_tree(net, depth - 1, rnd, types), right=_tree(net, depth - 1, rnd, types))


def _simulate(layout, boxes, rounds, values):
    """Run the rounds on numpy arrays: each rank's array covers the whole space, only its box is used."""
    held = [v.copy() for v in values]
    for mode, transfers in rounds:
        sent = [(t, held[t.src][t.box[0]:t.box[1], t.box[2]:t.box[3]].copy()) for t in transfers]
        for t, piece in sent:
            view = held[t.dst][t.box[0]:t.box[1], t.box[2]:t.box[3]]
            view[...] = view + piece if mode == "add" else piece
    return held


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from([1, 2, 3]))
def test_allreduce_rounds_leave_every_rank_the_sum_of_all_contributions_on_its_box(seed, depth):
    rnd = random.Random(seed)
    net = _net()
    layout = Layout(net, 9, _tree(net, depth, rnd))
    boxes = []
    for _ in range(layout.world):
        if rnd.random() < 0.2:
            boxes.append(None)
            continue
        r0, c0 = rnd.randrange(6), rnd.randrange(7)
        boxes.append((r0, rnd.randrange(r0 + 1, 7), c0, rnd.randrange(c0 + 1, 8)))
    gen = np.random.default_rng(seed)
    values = []
    for b in boxes:
        v = np.zeros((6, 7))
        if b is not None:
            v[b[0]:b[1], b[2]:b[3]] = gen.integers(1, 100, size=(b[1] - b[0], b[3] - b[2]))
        values.append(v)
    total = sum(values)
    rounds = allreduce_rounds(layout, boxes)
    held = _simulate(layout, boxes, rounds, values)
    for r, b in enumerate(boxes):
        if b is not None:
            assert np.array_equal(held[r][b[0]:b[1], b[2]:b[3]], total[b[0]:b[1], b[2]:b[3]]), r
    for _, transfers in rounds:
        assert len({t.level for t in transfers}) == 1
        assert all(t.level == layout.level(t.src, t.dst) for t in transfers)


def test_a_replicated_tensor_crosses_each_level_once_per_side_as_the_cost_model_counts():
    """Type I at every level on 8 ranks: every rank holds a partial of the whole weight; at every level
    each half of each group receives the tensor once in all (scatter and gather halves)."""
    net = _net()
    layout = Layout(net, 16, _tree(net, 3, random.Random(0), types=(0, 0)))
    whole = (0, 6, 0, 8)
    rounds = allreduce_rounds(layout, [whole] * layout.world)
    for level in range(3):
        groups = 2**level
        moved = sum(area(t.box) for _, ts in rounds for t in ts if t.level == level)
        assert moved == groups * 2 * area(whole), level  # groups x 2 halves x one tensor each


def _train(scheme_plans, workload="cnn", steps=40, **kw):
    from hetrain.data import load_dataset
    from hetrain.planner.train import DIGITS_SAMPLE, train_with_plan, workload_module

    return train_with_plan(workload_module(workload), load_dataset("cnn"), DIGITS_SAMPLE, "tpu-v3:1,tpu-v2:1", 32,
                           steps, progress=False, timeout_s=240, name=workload, plans=scheme_plans, **kw)


@pytest.mark.timeout(300)
def test_a_planned_cnn_learns_digits_and_every_checked_step_equals_the_whole_model(processes):
    report = _train(None, steps=60, time_scale=2e4, ddp_steps=5)
    assert report.final_accuracy >= 0.85, report.final_accuracy  # chance is 0.1
    assert report.checks_ok, report.checks
    assert len(report.checks) == 5 and report.checks[-1]["step"] == 59
    assert report.max_loss_diff_vs_unpartitioned <= 1e-9 and report.max_grad_diff_vs_unpartitioned <= 1e-9
    assert report.max_module_loss_diff <= 1e-9
    assert report.replica_disagreement < 1e-4
    assert report.loss_curve[-1][1] < report.loss_curve[0][1] / 3
    assert report.dp_step_s_measured > 0 and report.step_s_measured > 0


@pytest.mark.timeout(300)
def test_every_split_type_unequal_ratios_and_a_residual_join_train_exactly(processes):
    """Hand-made plans on two devices: II and III on the convolutions, the stem and the head, at ratio 0.3,
    on the residual model; every checked step's loss and gradients equal the whole model's."""
    from hetrain.planner.hierarchy import GroupPlan as G

    leaf = G("d", 1, 0, 0, 0, 0, 0)
    for types, joins in (((1, 2, 1, 2), ((1, 0),)), ((2, 1, 2, 1), ((0, 1),)), ((0, 2, 1, 0), ((2, 2),))):
        tree = G("g", 2, 0, 0, 0, 0, 0, alpha=0.3, assignment=Assignment(types, joins), left=leaf, right=leaf)
        report = _train({"plan": tree, "data-parallel": tree}, workload="cnn-residual", steps=6, time_scale=1.0,
                        ddp_steps=0)
        assert report.checks_ok, (types, report.checks)
        assert report.max_grad_diff_vs_unpartitioned <= 1e-9, types
        assert report.checks[-1]["loss"] < report.checks[0]["loss"], types  # it trains


def test_plan_train_refuses_what_it_cannot_run(tmp_path, capsys):
    from hetrain.cli import main

    out = tmp_path / "x.json"
    for argv, words in ((["--model", "mlp"], "--workload"), (["--workload", "gpt2"], "--workload"),
                        (["--scheme", "fsdp"], "--scheme"), (["--devices", "tpu-v3:1"], "at least 2"),
                        (["--devices", "tpu-v3:9"], "2 to 8"),
                        (["--measure"], "separate"), (["--dtype-bytes", "2"], "float32")):
        args = ["plan", "--train", "--devices", "tpu-v3:1,tpu-v2:1", "--steps", "2", "--json", str(out), *argv]
        if argv[0] == "--devices":
            args = ["plan", "--train", "--steps", "2", "--json", str(out), *argv]
        assert main(args) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (argv, err)
        assert not out.exists()


@pytest.mark.timeout(300)
def test_plan_train_json_has_the_train_record(processes, tmp_path):
    from hetrain.cli import main

    out = tmp_path / "plan.json"
    rc = main(["plan", "--train", "--workload", "mlp", "--devices", "tpu-v3:1,tpu-v2:1", "--steps", "8",
               "--batch", "32", "--time-scale", "1000", "--json", str(out)])
    assert rc == 0
    train = json.loads(out.read_text())["train"]
    for key in ("final_accuracy", "max_loss_diff_vs_unpartitioned", "step_s_measured", "step_s_predicted",
                "dp_step_s_measured", "speedup_over_dp_predicted"):
        assert isinstance(train[key], float), key
    assert 0 <= train["final_accuracy"] <= 1 and train["checks_ok"] is True


@pytest.mark.timeout(240)
def test_parallelize_trains_a_users_model_under_torchrun_as_the_whole_model_would(processes, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "result.json"
    script = Path(__file__).with_name("torchrun_parallelize.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(out)], env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["types"] != [0, 0], result["types"]  # the weights are split, not only the batch
    assert result["alpha"] != 0.5
    assert result["held"] < result["whole"]  # rank 0 holds a part of the model
    assert result["diff"] < 1e-4, result["diff"]  # the same training as the whole model's
    assert result["accuracy"] >= 0.8 and result["losses"][-1] < result["losses"][0] / 2


def _two_level(types_top, types_low, alpha=0.5):
    leaf = GroupPlan("d", 1, 0, 0, 0, 0, 0)
    low = [GroupPlan("g", 2, 0, 0, 0, 0, 0, alpha=0.5, assignment=Assignment(types_low), left=leaf, right=leaf)
           for _ in range(2)]
    return GroupPlan("g", 4, 0, 0, 0, 0, 0, alpha=alpha, assignment=Assignment(types_top), left=low[0], right=low[1])


def test_even_plans_export_to_torch_styles_and_uneven_ones_say_why_not():
    from hetrain.planner.export import NotExportable, export_plan

    net = Net("m", [Layer("0", "linear", 64, 64), Layer("2", "linear", 64, 10)],
              [Node("layer", 0, (-1,)), Node("layer", 1, (0,))])
    export = export_plan(net, _two_level((0, 0), (2, 1)))
    assert export.mesh == [("dp0", 2), ("tp", 2)] and export.styles == {"0": "colwise", "2": "rowwise"}
    for plan, words in ((_two_level((0, 0), (2, 1), alpha=0.797), "not 0.5"), (_two_level((2, 1), (2, 1)), "more than one"),
                        (_two_level((0, 2), (0, 0)), "type I")):
        with pytest.raises(NotExportable, match=words):
            export_plan(net, plan)


def _dtensor_worker(ctx):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    from hetrain.data import build_model
    from hetrain.planner.export import export_plan, parallelize_plan
    from hetrain.planner.trace import trace

    model = build_model("mlp", seed=0).double()
    reference = build_model("mlp", seed=0).double()
    net = trace(model, (64,), "mlp")
    leaf = GroupPlan("d", 1, 0, 0, 0, 0, 0)
    plan = GroupPlan("g", 2, 0, 0, 0, 0, 0, alpha=0.5, assignment=Assignment((2, 1)), left=leaf, right=leaf)
    export = export_plan(net, plan)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, parallelize_plan(export, net))
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = model(x)
    out = out.full_tensor() if isinstance(out, DTensor) else out
    out.sum().backward()
    ref = reference(x)
    ref.sum().backward()
    grad_err = max(float(((p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad) - q.grad).abs().max())
                   for p, q in zip(model.parameters(), reference.parameters()))
    sharded = [isinstance(p, DTensor) and p.to_local().numel() < p.numel() for p in model.parameters()]
    return float((out - ref).abs().max()), grad_err, sharded


@pytest.mark.timeout(180)
def test_an_exported_plan_runs_under_torch_tensor_parallel_as_the_whole_model(processes):
    from hetrain.jobs.local_job import run_local

    for out_err, grad_err, sharded in run_local(_dtensor_worker, 2, timeout_s=120, job_timeout_s=150):
        assert out_err < 1e-12 and grad_err < 1e-12
        assert sharded[0] and sharded[2]  # both weights are split, not replicated
