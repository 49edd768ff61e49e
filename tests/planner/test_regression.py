"""Today's planner, level by level, reproduces the planner of commit d4c0f75.

``data/regression.json`` holds that planner's full JSON output on 12 cases (zoo
models traced with torch then; pure tables now), see ``data/make_regression.py``.
Every plan and baseline must have the same types and joins at every level.
Where every split is an equal one, ratios, seconds, bytes and memory are the same
floats (``==``; memory as it was counted then: weights, gradients and kept
inputs, i.e. SGD). Where halves are unequal, the balanced ratio is found by a
different search since then (Newton steps on the re-costed plan instead of
regula falsi, docs/guides/planner.md "Speed"); both stop within 1e-4 of the root, so ratios
agree to 1e-4, a level's seconds and bytes to 1e-3 relative (a half's sizes
scale with its ratio, and a ratio of 0.04 off by 7e-6 is 2e-4 off), the step
time, total bytes and memory to 1e-4. A step's compute/communication
breakdown is that of its slower half, and at a balanced split that is a tie, so
only their sum is compared there. With memory enforced the plans are the same
too, since all 12 fit.
"""

import json
from pathlib import Path

import pytest

from hetrain.planner import plan_model

CASES = json.loads((Path(__file__).parent / "data" / "regression.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[f"{c['case'][0]}-{c['case'][2]}" for c in CASES])
def test_same_plans_as_before(case):
    model, batch, devices, objective, types, nbytes = case["case"]
    got = plan_model(model, batch, devices, objective, types, nbytes, optimizer="sgd", fit_memory=False,
                     search="greedy").json()
    assert got["layers"] == case["layers"] and got["params"] == case["params"]
    assert set(got["plans"]) == set(case["plans"])
    for name, ref in case["plans"].items():
        mine = got["plans"][name]
        if all(level["ratio"] == 0.5 for level in ref["levels"]):
            assert mine["levels"] == ref["levels"], name
            for key in ("step_s", "compute_s", "comm_s", "comm_bytes", "memory_bytes_per_device"):
                assert mine[key] == ref[key], (name, key, mine[key], ref[key])
        else:
            _same_within_ratio_tolerance(name, mine, ref)
        assert mine["memory_fits"]


def _same_within_ratio_tolerance(name, mine, ref):
    assert len(mine["levels"]) == len(ref["levels"]), name
    for got, want in zip(mine["levels"], ref["levels"]):
        assert (got["devices"], got["types"], got["joins"]) == (want["devices"], want["types"], want["joins"]), name
        assert got["ratio"] == pytest.approx(want["ratio"], abs=1e-4), (name, got["devices"])
        for key in ("level_comm_s", "level_comm_bytes"):
            assert got[key] == pytest.approx(want[key], rel=1e-3), (name, got["devices"], key)
    for key in ("step_s", "comm_bytes", "memory_bytes_per_device"):
        assert mine[key] == pytest.approx(ref[key], rel=1e-4), (name, key)
    assert mine["compute_s"] + mine["comm_s"] == pytest.approx(mine["step_s"], rel=1e-12), name


def test_enforcing_memory_changes_nothing_when_everything_fits():
    case = next(c for c in CASES if c["case"][0] == "resnet-152")
    model, batch, devices, objective, types, nbytes = case["case"]
    got = plan_model(model, batch, devices, objective, types, nbytes, optimizer="sgd", fit_memory=True).json()
    _same_within_ratio_tolerance("plan", got["plans"]["plan"], case["plans"]["plan"])
