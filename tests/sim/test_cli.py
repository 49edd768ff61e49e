"""`hetrain simulate` end to end: outputs, sweeps, and one-line errors with exit code 2."""

import json

import pytest

from hetrain.cli import main
from hetrain.metrics import build_metrics


@pytest.mark.parametrize("argv, words", [
    (["--protocol", "nope", "--iterations", "5"], "unknown protocol"),
    (["--iterations", "5", "--slowdown", "9:5x", "--workers", "4"], "names worker 9"),
    (["--iterations", "5", "--slowdown", "every:0:5x"], "need N >= 1"),
    (["--iterations", "5", "--math", "mnist"], "unknown --math"),
    (["--workers", "4"], "--iterations"),
    (["--iterations", "5", "--bandwidth-gbps", "0"], "--bandwidth-gbps"),
    (["--iterations", "5", "--collective-step-us", "-1"], "--collective-step-us"),
    (["--iterations", "5", "--sweep", "nodes=1,2"], "--sweep"),
    (["--iterations", "5", "--protocol", "hop", "--backup", "2", "--topology", "ring"], "--backup 2"),
    (["--iterations", "5", "--protocol", "hypercube"], "unknown protocol"),
    (["--iterations", "5", "--topology", "hypercube", "--workers", "6", "--protocol", "dpsgd"], "power-of-two"),
    (["--iterations", "five"], "invalid int"),
    # settings the simulator does not model are refused, not ignored
    (["--iterations", "5", "--optimizer", "adamw"], "--optimizer adamw is not modelled"),
    (["--iterations", "5", "--momentum", "0.5"], "drop --momentum 0.5"),
    (["--iterations", "5", "--target-loss", "2.0"], "--target-loss applies to"),
    (["--iterations", "5", "--workload", "lm"], "does not model --workload lm"),
    (["--iterations", "5", "--workload", "cnn", "--math", "digits"], "does not model --workload cnn"),
    (["--iterations", "5", "--data-split", "shard"], "drop --data-split shard"),  # was ignored
    (["--iterations", "5", "--fail", "1@checkpoint"], "run it with hetrain train"),  # not train's advice
])
def test_bad_input_is_a_one_line_error_with_exit_code_2(argv, words, tmp_path, capsys):
    assert main(["simulate", *argv, "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_what_the_simulator_models_is_accepted_and_recorded(tmp_path):
    out = tmp_path / "run"
    argv = ["simulate", "--workers", "4", "--iterations", "5", "--optimizer", "sgd", "--momentum", "0",
            "--workload", "synthetic", "--model-params", "1000", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    record = json.loads((out / "metrics.json").read_text())
    assert record["model_params"] == 1000 and record["total_iterations"] == 20


def test_simulate_writes_the_fields_train_writes(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["simulate", "--protocol", "hop", "--workers", "4", "--iterations", "20", "--slowdown", "0:5x",
            "--backup", "1", "--topology", "complete", "--timelines", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    record = json.loads((out / "metrics.json").read_text())
    reference = build_metrics(protocol="hop", workers=[{"iterations": 1, "compute_s": 1.0, "wait_s": 0.0}],
                              wall_time_s=1.0, batch_size=32, standalone_iteration_s=[1.0])
    assert set(reference) <= set(record)
    assert record["simulated"] is True and record["num_workers"] == 4
    assert all(set(("iterations", "compute_s", "wait_s")) <= set(w) for w in record["workers"])
    timelines = json.loads((out / "timelines.json").read_text())
    assert len(timelines["workers"]) == 4
    assert sum(len(t) for t in timelines["workers"]) == record["total_iterations"]
    assert "heterogeneity efficiency" in capsys.readouterr().out


def test_sweep_writes_table_json_and_plot(tmp_path):
    out = tmp_path / "sweep"
    argv = ["simulate", "--protocol", "allreduce,hop", "--sweep", "workers=4,8", "--time-budget", "1",
            "--slowdown", "every:4:5x", "--backup", "1", "--topology", "double_ring", "--out", str(out),
            "--no-progress"]
    assert main(argv) == 0
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert [(r["protocol"], r["num_workers"]) for r in rows] == [
        ("allreduce", 4), ("allreduce", 8), ("hop", 4), ("hop", 8)]
    assert (out / "sweep.png").stat().st_size > 1000
    assert "| allreduce | 8 |" in (out / "sweep.md").read_text()
    assert (out / "runs" / "hop-8" / "metrics.json").exists()


def test_collective_step_slows_the_allreduce_by_its_steps(tmp_path, capsys):
    def wall(*extra):
        out = tmp_path / "-".join(extra or ("default",))
        assert main(["simulate", "--protocol", "allreduce", "--workers", "4", "--iterations", "10", "--compute-ms", "50",
                     "--latency-us", "100", *extra, "--out", str(out), "--no-progress"]) == 0
        return json.loads((out / "metrics.json").read_text())["wall_time_s"]

    # 10 iterations x 2 (4 - 1) ring steps, each 900 us slower than the 100 us latency
    assert wall("--collective-step-us", "1000") - wall() == pytest.approx(10 * 6 * 900e-6)


def test_a_job_that_may_grow_is_refused_by_the_simulator_not_run_at_its_first_size():
    from hetrain.config import RunConfig
    from hetrain.errors import UsageError
    from hetrain.sim.runner import refuse_unmodelled

    with pytest.raises(UsageError, match="does not model workers joining a running job"):
        refuse_unmodelled(RunConfig(protocol="hop", num_workers=2, max_workers=4, join="2@5s", iterations=10))
