"""Today's planner, level by level, reproduces the planner of commit d4c0f75 bit for bit.

``data/regression.json`` holds that planner's full JSON output on 12 cases (zoo
models traced with torch then; pure tables now), see ``data/make_regression.py``.
Every plan and baseline must have the same types, joins and ratios at every
level and the same seconds, bytes and memory, compared as floats with ``==``
(memory as it was counted then: weights, gradients and kept inputs, i.e. SGD).
With memory enforced the plans are the same too, since all 12 fit.
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
        assert mine["levels"] == ref["levels"], name
        for key in ("step_s", "compute_s", "comm_s", "comm_bytes", "memory_bytes_per_device"):
            assert mine[key] == ref[key], (name, key, mine[key], ref[key])
        assert mine["memory_fits"]


def test_enforcing_memory_changes_nothing_when_everything_fits():
    case = next(c for c in CASES if c["case"][0] == "resnet-152")
    model, batch, devices, objective, types, nbytes = case["case"]
    got = plan_model(model, batch, devices, objective, types, nbytes, optimizer="sgd", fit_memory=True).json()
    assert got["plans"]["plan"]["levels"] == case["plans"]["plan"]["levels"]
    assert got["plans"]["plan"]["step_s"] == case["plans"]["plan"]["step_s"]
