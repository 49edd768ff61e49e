"""benchmarks/demo_goals.py reads issue 37's verdicts off comparisons as the issue states them."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_goals():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import demo_goals
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return demo_goals


def _row(protocol, accuracy, loss, drift, efficiency, worst_vs_ddp):
    return {"protocol": protocol, "final_accuracy_avg_model": accuracy, "final_loss_avg_model": loss,
            "loss_drift": drift, "heterogeneity_efficiency": efficiency,
            "speedup_time_to_target_worst_worker": worst_vs_ddp}


def _comparison(tmp_path, name, rows):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "summary.json").write_text(json.dumps({"runs": rows}))
    return directory


def test_each_goal_is_met_at_its_bound_and_missed_just_past_it(tmp_path, demo_goals):
    ddp = _row("allreduce", 0.970, 0.100, 0.65, 0.21, 1.0)
    at_bounds = _comparison(tmp_path, "at", [ddp, _row("hop", 0.965, 0.115, 1.05, 0.93, 3.0),
                                             _row("prague", 0.98, 0.1, 1.0, 0.98, 3.0)])
    past = _comparison(tmp_path, "past", [ddp, _row("hop", 0.9649, 0.1151, 1.051, 0.929, 2.99),
                                          _row("prague", 0.98, 0.1, 1.0, 0.98, 2.99)])
    runs, markdown = demo_goals.report([at_bounds, past])
    assert all(v["met"] for v in runs[0]["goals"].values()), runs[0]
    assert not any(v["met"] for v in runs[1]["goals"].values()), runs[1]
    assert runs[0]["goals"]["hop loss <= 1.15x allreduce's"]["figure"] == pytest.approx(1.15)
    assert "- prague worst worker >= 3x sooner than DDP: met in 1 of 2 runs" in markdown


def test_a_comparison_without_prague_is_tallied_on_the_goals_it_has(tmp_path, demo_goals):
    ddp = _row("allreduce", 0.97, 0.1, 0.65, 0.21, 1.0)
    hop_only = _comparison(tmp_path, "hop", [ddp, _row("hop", 0.97, 0.1, 1.0, 0.97, 3.5)])
    full = _comparison(tmp_path, "full", [ddp, _row("hop", 0.97, 0.1, 1.0, 0.97, 2.0),
                                          _row("prague", 0.97, 0.1, 1.0, 0.97, 2.0)])
    runs, markdown = demo_goals.report([hop_only, full])
    assert "prague worst worker >= 3x sooner than DDP" not in runs[0]["goals"]
    assert "- hop worst worker >= 3x sooner than DDP: met in 1 of 2 runs" in markdown
    assert "- prague worst worker >= 3x sooner than DDP: met in 0 of 1 runs" in markdown
    with pytest.raises(ValueError, match="allreduce and hop"):
        demo_goals.report([_comparison(tmp_path, "no-ddp", [_row("hop", 0.97, 0.1, 1.0, 0.97, 3.5)])])
