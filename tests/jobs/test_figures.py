"""What the headline figures measure: standalone speeds (efficiency's denominator) and the worst worker's time to target."""

import math

import numpy as np
import pytest
import torch

from hetrain.config import RunConfig
from hetrain.data import build_model, evaluate, load_dataset, loss_fn
from hetrain.jobs.capacity import efficiency_basis, lost_worker_iteration_s, standalone_iteration_s
from hetrain.jobs.evaluation import evaluation_curve
from hetrain.metrics import build_metrics
from hetrain.runtime.flat_state import FlatState
from hetrain.slowdown import parse_slowdown


def test_emulated_compute_gives_the_emulated_time_times_the_slowdown():
    config = RunConfig(compute_ms=50.0, slowdown="0:5x")
    slowdown = parse_slowdown(config.slowdown)
    assert efficiency_basis(config) == "emulated"
    assert standalone_iteration_s(config, slowdown, 0, 0.001, 99.0, 10) == pytest.approx(0.25)
    assert standalone_iteration_s(config, slowdown, 1, 0.001, 99.0, 10) == pytest.approx(0.05)
    assert standalone_iteration_s(config, slowdown, 1, 0.2, 99.0, 10) == pytest.approx(0.2)  # math is longer


def test_real_compute_uses_the_compute_time_measured_in_the_run():
    config = RunConfig(slowdown="0:5x")
    slowdown = parse_slowdown(config.slowdown)
    assert efficiency_basis(config) == "in-run"
    assert standalone_iteration_s(config, slowdown, 0, 0.001, 6.0, 20) == pytest.approx(0.3)
    survivors = [{"rank": 0, "math_s": 0.01, "standalone_iteration_s": 0.5},  # 5x: 0.1 per unit
                 {"rank": 1, "math_s": 0.01, "standalone_iteration_s": 0.1},
                 {"rank": 2, "math_s": 0.01, "standalone_iteration_s": 0.12}]
    assert lost_worker_iteration_s(config, slowdown, 3, survivors) == pytest.approx(0.1)


def test_in_run_efficiency_is_at_most_one_whatever_the_waiting():
    """Samples/s over the sum of in-run speeds: each worker computes at most the wall time."""
    rng = np.random.default_rng(0)
    config = RunConfig(slowdown="none")
    slowdown = parse_slowdown(config.slowdown)
    for _ in range(50):
        wall = 10.0
        workers = []
        for rank in range(4):
            iterations = int(rng.integers(1, 500))
            compute_s = float(rng.uniform(0.01, 1.0)) * wall
            workers.append({"rank": rank, "iterations": iterations, "compute_s": compute_s,
                            "wait_s": wall - compute_s})
        speeds = [standalone_iteration_s(config, slowdown, w["rank"], 0.0, w["compute_s"], w["iterations"])
                  for w in workers]
        record = build_metrics(protocol="hop", workers=workers, wall_time_s=wall, batch_size=32,
                               standalone_iteration_s=speeds, efficiency_basis="in-run")
        assert 0 < record["heterogeneity_efficiency"] <= 1.0 + 1e-12
        assert record["efficiency_basis"] == "in-run"


def _trained_and_untrained_flats():
    """A digits MLP trained to > 95% test accuracy, and the same model untrained (chance)."""
    config = RunConfig(workload="mlp")
    data = load_dataset("mlp", 0)
    model = build_model("mlp", None, 0)
    untrained = FlatState(model).gather().clone().numpy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(300):
        optimizer.zero_grad()
        loss_fn(model(data.x_train), data.y_train).backward()
        optimizer.step()
    assert evaluate(model, data.x_test, data.y_test)[0] > 0.95
    return config, data, FlatState(model).gather().clone().numpy(), untrained


def test_worst_worker_time_to_target_waits_for_every_workers_own_model():
    config, data, trained, untrained = _trained_and_untrained_flats()
    # worker 0 is trained from t=1; worker 1 only from t=3: the average may reach the target first,
    # the worst worker's own model not before t=3
    snapshots = [
        [(0.0, 0.0, 0, untrained), (1.0, 1.0, 10, trained), (2.0, 2.0, 20, trained), (3.0, 3.0, 30, trained),
         (math.inf, 3.5, 35, trained)],
        [(0.0, 0.0, 0, untrained), (1.0, 1.1, 10, untrained), (2.0, 2.1, 20, untrained),
         (3.0, 3.1, 30, trained), (math.inf, 3.6, 35, trained)],
    ]
    curve, worst_s = evaluation_curve(config, snapshots, data)
    assert [p["t_s"] for p in curve] == [0.0, 1.1, 2.1, 3.1, 3.6]
    assert worst_s == 3.1
    assert [p.get("worst_worker_at_target") for p in curve] == [False, False, False, True, None]
    assert curve[-1]["accuracy_avg_model"] > 0.95


def test_worst_worker_never_at_target_reports_none():
    config, data, trained, untrained = _trained_and_untrained_flats()
    snapshots = [[(0.0, 0.0, 0, trained), (math.inf, 1.0, 5, trained)],
                 [(0.0, 0.0, 0, untrained), (math.inf, 1.0, 5, untrained)]]
    curve, worst_s = evaluation_curve(config, snapshots, data)
    assert worst_s is None
    assert [p["worst_worker_at_target"] for p in curve] == [False, False]


def test_a_trace_or_random_slowdown_s_standalone_speed_is_of_the_factors_the_worker_got(tmp_path):
    """A trace 10x slower from iteration 200, and a worker that ran 150: its standalone iteration was the
    trace's mean over 1,000 iterations (8.2x) and the run's efficiency read 4.32."""
    from hetrain.slowdown import parse_slowdown

    trace = tmp_path / "trace.csv"
    trace.write_text("worker,iteration,factor\n" + "".join(f"0,{i},10\n" for i in range(200, 1000)))
    config = RunConfig(protocol="hop", num_workers=2, compute_ms=5.0, iterations=150, slowdown=f"trace:{trace}")
    slowdown = parse_slowdown(config.slowdown, config.seed)
    assert standalone_iteration_s(config, slowdown, 0, 0.001, 0.0, 150) == pytest.approx(0.005)
    assert standalone_iteration_s(config, slowdown, 0, 0.001, 0.0, 400) == pytest.approx(0.005 * (200 + 2000) / 400)
    drawn = parse_slowdown("random:p=0.1,factor=6", 3)
    got = sum(drawn.factor(1, i) for i in range(100)) / 100
    random_config = config.replace(slowdown="random:p=0.1,factor=6")
    assert standalone_iteration_s(random_config, drawn, 1, 0.001, 0.0, 100) == pytest.approx(0.005 * got)


def test_a_replacement_that_joined_late_leaves_the_earlier_curve_and_times_to_target_alone(monkeypatch):
    """Its first snapshot stood for tick 0, so every tick before its join used it: 41 curve points at the
    join (20 s) and both times to target 20 s where the survivors were at target from 2 s."""
    import hetrain.jobs.evaluation as evaluation
    from hetrain.jobs.snapshots import SnapshotKeeper

    numel = FlatState(build_model("mlp", None, 0)).numel
    monkeypatch.setattr(evaluation, "evaluate", lambda model, x, y: (float(next(model.parameters()).detach().flatten()[0]), 0.0))

    def worker(start, end):
        keeper = SnapshotKeeper(0.5, numel * 4, start_s=start)
        for t in np.arange(start, end, 0.25):
            keeper.maybe_take(float(t), int(t * 100), lambda t=t: torch.full((numel,), 0.1 if t < 2.0 else 0.97))
        keeper.take_final(end, int(end * 100), lambda: torch.full((numel,), 0.97))
        return [(due, t, it, flat.numpy()) for due, t, it, flat in keeper.snapshots]

    config = RunConfig(protocol="hop", num_workers=3, time_budget_s=30.0)
    data = type("Data", (), {"x_test": None, "y_test": None})()
    curve, worst = evaluation_curve(config, [worker(0.0, 30.0), worker(0.0, 30.0), worker(20.0, 30.0)], data)
    assert worst == 2.0 and next(p["t_s"] for p in curve if p["accuracy_avg_model"] >= 0.95) == 2.0
    assert sum(p["t_s"] == 20.0 for p in curve) <= 1
