"""--log and sync.log_to: each logger's files are read back with the tool's own reader (real packages,
no mocks): TensorBoard's EventAccumulator, the csv module, `wandb leet inspect --json` over the offline
run's transaction log, MLflow's client over its file store."""

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import hetrain
from hetrain.cli import main
from hetrain.jobs.local_job import run_local
from hetrain.loggers.run_logger import RunLogger
from hetrain.loggers.scalar_writers import CsvWriter, make_writers, parse_log_kinds

# (tag, step, value): two tags, steps out of order for one of them (as the launcher writes the
# accuracy curve after the live figures), values that are not round in binary
WRITTEN = [("throughput/samples_per_s", step, 100.0 + step / 7) for step in (0, 1000, 2000)] + \
          [("eval/accuracy", step, step / 3000 + 0.1) for step in (500, 1500)]


def read_csv(path) -> list[tuple[str, int, float]]:
    with open(path, newline="") as handle:
        return [(row["tag"], int(row["step"]), float(row["value"])) for row in csv.DictReader(handle)]


def read_tensorboard(log_dir) -> list[tuple[str, int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0: keep every point
    events.Reload()
    return [(tag, e.step, e.value) for tag in events.Tags()["scalars"] for e in events.Scalars(tag)]


def read_wandb(run_dir) -> list[tuple[str, int, float]]:
    """The history rows of an offline run, through W&B's own reader of its transaction log."""
    out = subprocess.run([str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--json", str(run_dir)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    rows = [json.loads(line)["history"]["item"] for line in out.splitlines() if '"type":"history"' in line]
    return [(tag, int(row["step"]), value) for row in rows for tag, value in row.items()
            if not tag.startswith("_") and tag != "step"]


def read_mlflow(store_dir, run_name) -> list[tuple[str, int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=Path(store_dir).resolve().as_uri())
    experiment = client.get_experiment_by_name("hetrain")
    (run,) = client.search_runs([experiment.experiment_id], filter_string=f"attributes.run_name = '{run_name}'")
    return [(tag, m.step, m.value) for tag in run.data.metrics for m in client.get_metric_history(run.info.run_id, tag)]


def _same(read, written, rel=1e-6):
    """The same (tag, step) points with the same values (TensorBoard stores float32)."""
    got = {(tag, step): value for tag, step, value in read}
    assert len(got) == len(read), "a point was written twice"
    assert set(got) == {(tag, step) for tag, step, _ in written}
    for tag, step, value in written:
        assert got[(tag, step)] == pytest.approx(value, rel=rel), (tag, step)


@pytest.fixture
def no_tracking_env(monkeypatch):
    """Offline and local by default: the user's W&B / MLflow settings must not leak into the test."""
    for name in ("WANDB_MODE", "WANDB_PROJECT", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


@pytest.mark.parametrize("kind", ["csv", "tensorboard", "wandb", "mlflow"])
def test_each_writer_reads_back_every_tag_and_step(processes, tmp_path, no_tracking_env, kind):
    writer = make_writers([kind], tmp_path, "probe", {"protocol": "hop", "log": (kind,)})
    for tag, step, value in WRITTEN:
        writer.add_scalar(tag, value, step)
    writer.close()
    if kind == "csv":
        _same(read_csv(tmp_path / "scalars.csv"), WRITTEN, rel=1e-12)
    elif kind == "tensorboard":
        _same(read_tensorboard(tmp_path), WRITTEN)
    elif kind == "wandb":
        (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")  # offline: a run directory, nothing sent
        _same(read_wandb(run_dir), WRITTEN, rel=1e-12)
    else:
        _same(read_mlflow(tmp_path / "mlruns", "probe"), WRITTEN, rel=1e-12)


def _logged_steps(ctx, out_dir):
    """Four steps of D-PSGD, then four of All-Reduce, each logging every second step to its own CSV."""
    results = {}
    for name in ("DPSGD", "AllReduce"):
        torch.manual_seed(ctx.rank)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        writer = CsvWriter(Path(out_dir) / f"{name}-{ctx.rank}.csv")
        with getattr(hetrain, name)(model, optimizer) as sync:
            sync.log_to(writer, every=2)
            for _ in range(4):
                optimizer.zero_grad()
                sync.module(torch.randn(8, 4)).pow(2).mean().backward()
                optimizer.step()
            results[name] = {k: v for k, v in sync.metrics().items() if k in ("exchanges", "bytes_sent")}
        writer.close()
    return results


def test_log_to_writes_the_protocols_own_figures_every_n_steps(processes, tmp_path):
    results = run_local(_logged_steps, 2, (str(tmp_path),), timeout_s=30)
    for rank, by_protocol in enumerate(results):
        for name, final in by_protocol.items():
            points = read_csv(tmp_path / f"{name}-{rank}.csv")
            tags = {tag for tag, _, _ in points}
            queue_tags = {f"worker{rank}/{t}" for t in ("queue_length", "updates_stale", "max_iteration_gap")}
            expected = {f"worker{rank}/{t}" for t in ("wait_fraction", "exchanges", "bytes_sent")}
            # D-PSGD keeps update queues; All-Reduce has none, and writes no made-up zero for them
            assert tags == (expected | queue_tags if name == "DPSGD" else expected), name
            assert sorted({step for _, step, _ in points}) == [2, 4], name  # every 2nd of 4 iterations
            last = {tag: value for tag, step, value in points if step == 4}
            assert last[f"worker{rank}/exchanges"] == final["exchanges"] == 4
            assert 0 < last[f"worker{rank}/bytes_sent"] <= final["bytes_sent"]
            assert all(0 <= v <= 1 for t, _, v in points if t.endswith("wait_fraction"))


# what a local Hop run writes (docs/guides/logging.md); Hop keeps queues, so their tags are there too
LIVE_TAGS = {"throughput/samples_per_s", "workers/live", "workers/iteration_spread", "comm/bytes_sent"}
WORKER_TAGS = {"wait_fraction", "exchanges", "bytes_sent", "queue_length", "updates_stale", "max_iteration_gap"}
RECORD_TAGS = {"eval/accuracy", "eval/loss", "train/loss", "efficiency/heterogeneity"}


def test_train_with_log_csv_and_tensorboard_writes_every_figure_over_time(processes, tmp_path, no_tracking_env):
    out = tmp_path / "run"
    code = main(["train", "--protocol", "hop", "--workers", "2", "--time-budget", "2.2", "--compute-ms", "10",
                 "--slowdown", "0:2x", "--eval-interval", "0.5", "--no-progress", "--log", "csv,tensorboard",
                 "--out", str(out)])
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    points = read_tensorboard(out)
    _same(points, read_csv(out / "scalars.csv"))  # both writers got the same points
    tags = {tag for tag, _, _ in points}
    assert tags == LIVE_TAGS | RECORD_TAGS | {f"worker{r}/{t}" for r in (0, 1) for t in WORKER_TAGS}

    def series(tag):
        return sorted((step, value) for t, step, value in points if t == tag)

    live = series("workers/live")
    assert len(live) >= 2 and all(v == 2 for _, v in live), "a live point per second of a 2.2 s run, 2 workers"
    assert all(step <= 1000 * metrics["wall_time_s"] + 1 for step, _ in live)  # steps: ms of training
    assert all(0 <= v <= 1 for r in (0, 1) for _, v in series(f"worker{r}/wait_fraction"))
    assert series("comm/bytes_sent")[-1][1] > 0
    rates = [v for _, v in series("throughput/samples_per_s")]
    assert all(v > 0 for v in rates)
    # the record's curves, at their own times: the averaged model's accuracy is metrics.json's curve
    curve = [(round(p["t_s"] * 1000), p["accuracy_avg_model"]) for p in metrics["accuracy_curve"]]
    assert [s for s, _ in series("eval/accuracy")] == sorted({s for s, _ in curve})
    assert all(math.isclose(v, dict(curve)[s], rel_tol=1e-6) for s, v in series("eval/accuracy"))
    ideal = metrics["ideal_samples_per_s"]
    assert [v for _, v in series("efficiency/heterogeneity")] == pytest.approx(
        [w["samples_per_s"] / ideal for w in metrics["throughput_series"]], rel=1e-6)

    # under torchrun no report reaches a launcher during the run: the record alone gives the throughput
    # windows and each worker's whole-run figures (Hop's record has no queue length now, only its maximum)
    replay = RunLogger(CsvWriter(tmp_path / "replay.csv"), 2, metrics["config"]["batch_size"])
    replay.finish(metrics)
    replay.close()
    assert {tag for tag, _, _ in read_csv(tmp_path / "replay.csv")} == RECORD_TAGS | {"throughput/samples_per_s"} | {
        f"worker{r}/{t}" for r in (0, 1) for t in WORKER_TAGS - {"queue_length"}}


def _one_line_error(capsys, tmp_path, *args) -> str:
    out = tmp_path / "out"
    code = main(["train", "--iterations", "3", "--workers", "2", "--out", str(out), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert not out.exists(), "bad input must not create the output directory"
    return err[0]


def test_an_unknown_log_kind_is_a_one_line_error(capsys, tmp_path):
    message = _one_line_error(capsys, tmp_path, "--log", "csv,nope")
    assert "unknown --log kind 'nope'" in message and "tensorboard" in message


def test_a_missing_package_names_its_extra(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what Python does for a package that is not installed
    message = _one_line_error(capsys, tmp_path, "--log", "csv,wandb")
    assert message.endswith("--log wandb needs the wandb package: pip install 'hetrain[wandb]'")


def test_log_kinds_parse_each_once_and_none_is_empty():
    assert parse_log_kinds("csv, TensorBoard,csv") == ("csv", "tensorboard")
    assert parse_log_kinds("none") == () == parse_log_kinds("")


def test_a_failing_writer_costs_the_figures_not_the_run(tmp_path):
    writer = CsvWriter(tmp_path / "scalars.csv")
    writer.close()  # writing now raises, as a full disk would
    logger = RunLogger(writer, num_workers=1, batch_size=32)
    report = {"t_s": 1.5, "computed": 10, "figures": {"iteration": 10, "iterations": 10, "exchanges": 10,
                                                      "compute_s": 1.0, "wait_s": 0.5, "bytes_sent": 100}}
    with pytest.warns(UserWarning, match="--log: writing the figures failed"):
        logger.on_message(0, report)
    assert logger.failed
    logger.on_message(0, dict(report, t_s=3.0))  # no second warning, no error
    logger.finish({"wall_time_s": 3.0, "accuracy_curve": [], "throughput_series": [], "workers": []})
    logger.close()
