"""What the launcher shows once the bar reaches 100%: the workers finishing (the final average), then the
evaluation of the models kept during training, which took tens of seconds for the LM in silence (issue 70)."""

import math

from hetrain.config import RunConfig
from hetrain.data import build_model, load_dataset
from hetrain.jobs.evaluation import evaluation_curve
from hetrain.jobs.run import _ProgressBar
from hetrain.runtime.flat_state import FlatState


def test_the_evaluation_of_the_kept_models_shows_its_progress_and_is_silent_when_asked(capsys):
    config = RunConfig(workload="mlp", eval_interval_s=0.5)
    data = load_dataset(config.workload, config.seed)
    flat = FlatState(build_model(config.workload, config.model_params, config.seed)).gather().numpy()
    snapshots = [[(0.0, 0.0, 0, flat), (0.5, 0.5, 5, flat), (math.inf, 0.9, 9, flat)] for _ in range(2)]
    curve, _ = evaluation_curve(config, snapshots, data, progress=True)
    shown = capsys.readouterr().err
    assert len(curve) == 3 and "evaluating the models kept every 0.5 s" in shown and "0/3" in shown
    evaluation_curve(config, snapshots, data)  # no bar by default (tests, and runs without --progress)
    assert capsys.readouterr().err == ""


def test_the_bar_says_the_workers_are_finishing_once_training_is_over(capsys):
    bar = _ProgressBar(RunConfig(num_workers=2, iterations=4), "hop", enabled=True)
    try:
        bar.update(0, {"iteration": 4, "computed": 4, "t_s": 1.0})
        bar.update(1, {"iteration": 3, "computed": 3, "t_s": 1.0})
        assert "finishing" not in bar.bar.postfix  # worker 1 still trains
        bar.update(1, {"iteration": 4, "computed": 4, "t_s": 1.1})
        assert bar.bar.postfix.endswith("finishing (final average): 0 of 2 done")
        assert "finishing (final average): 0 of 2 done" in capsys.readouterr().err  # at once, with no tty too
        bar.update(0, {"iteration": 4, "computed": 4, "t_s": 1.2, "done": True})
        assert bar.bar.postfix.endswith("finishing (final average): 1 of 2 done")
    finally:
        bar.close()
