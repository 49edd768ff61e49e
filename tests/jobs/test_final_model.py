"""The final model: every worker holds the one model ``finish()`` leaves, and one worker evaluates it."""

import pytest

from hetrain.config import RunConfig
from hetrain.jobs.run import _final_model_scores, run_training


@pytest.mark.parametrize("fail", [None, "0@1.5"], ids=["all-live", "rank-0-dead"])
def test_one_worker_evaluates_the_final_model_that_every_worker_holds(processes, tmp_path, fail):
    config = RunConfig(protocol="hop", num_workers=3, compute_ms=10.0, time_budget_s=3.0, slowdown="1:2x",
                       fail=fail, on_failure="continue")
    metrics = run_training(config, str(tmp_path / "run"), progress=False)
    workers = sorted(metrics["workers"], key=lambda w: w["rank"])
    live = [w for w in workers if w.get("model_fingerprint") is not None]
    assert len(live) == (3 if fail is None else 2)
    assert all(w["model_fingerprint"] == pytest.approx(live[0]["model_fingerprint"], rel=1e-9) for w in live)
    if fail is None:  # the workers' models as their loops ended differed (slowed rank 1, own shards)
        assert metrics["consensus_distance"] > 0  # (two survivors whose last step was a mix may end equal)
    scored = [w for w in live if w["consensus_accuracy"] is not None]
    assert [w["rank"] for w in scored] == [live[0]["rank"]]  # the lowest live rank, alone
    assert metrics["final_accuracy_avg_model"] == scored[0]["consensus_accuracy"] > 0.5
    assert metrics["final_loss_avg_model"] == scored[0]["consensus_loss"]


def test_without_the_evaluating_worker_the_record_takes_the_curves_last_averaged_model():
    curve = [{"accuracy_avg_model": 0.5, "loss_avg_model": 1.0}, {"accuracy_avg_model": 0.9, "loss_avg_model": 0.3}]
    unscored = {"consensus_accuracy": None, "consensus_loss": None}
    assert _final_model_scores([unscored, {"consensus_accuracy": 0.8, "consensus_loss": 0.4}], curve) == (0.8, 0.4)
    assert _final_model_scores([unscored, unscored], curve) == (0.9, 0.3)
    assert _final_model_scores([unscored], []) == (None, None)
