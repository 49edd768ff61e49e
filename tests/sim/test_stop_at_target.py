"""The simulator's model math can end a run where the averaged model first reaches the target accuracy."""

import pytest

from hetrain.config import RunConfig
from hetrain.sim.runner import SimOptions, simulate


@pytest.mark.parametrize("protocol, options", [("prague", {"group_size": 2}), ("hop", {"topology": "ring"}),
                                               ("allreduce", {})])
def test_a_run_told_to_stop_at_the_target_ends_there_and_one_not_told_runs_its_budget(protocol, options):
    config = RunConfig(protocol=protocol, num_workers=4, compute_ms=50, slowdown="0:3x", momentum=0.0,
                       data_split="whole", time_budget_s=40.0, options=options).validate()
    math = dict(math="digits", math_momentum=0.9, math_eval_points=400)
    stopped = simulate(config, SimOptions(**math, math_stop_at_target=True))
    full = simulate(config, SimOptions(**math))
    assert full["time_to_target_s"] is not None and full["wall_time_s"] == pytest.approx(40.0, abs=0.3)
    assert stopped["time_to_target_s"] == pytest.approx(full["time_to_target_s"])  # the same run, up to there
    assert stopped["wall_time_s"] == pytest.approx(stopped["time_to_target_s"], abs=1e-9)
    assert stopped["wall_time_s"] < 39.0 and stopped["total_iterations"] < full["total_iterations"]
