"""Regressions of the simulator's review findings: each test fails on the code before its fix."""

import json
import math

import pytest

from hetrain.cli import main
from hetrain.config import RunConfig
from hetrain.errors import UsageError
from hetrain.sim import NetworkParams, SimOptions, simulate
from hetrain.sim.math_model import DIGITS_PARAMS
from hetrain.sim.network import ring_allreduce_s
from hetrain.sim.sweep import markdown_table


def test_prague_overlap_with_math_runs_a_stopped_workers_owed_groups():
    """A worker that reached its last iteration runs the groups it still owes in the foreground (no shadow
    buffer): averaging them must not look for one (it raised KeyError)."""
    config = RunConfig(protocol="prague", num_workers=16, iterations=12, slowdown="0:3x,4:3x,8:3x,12:3x",
                       compute_ms=50.0, options={"gg": "random"})
    record = simulate(config, SimOptions(math="digits"))
    assert record["groups_run"] > 0
    assert all(w["iterations"] == 12 for w in record["workers"])
    assert record["final_accuracy_avg_model"] is not None


def test_allreduce_counts_only_computations_that_end_by_the_budget():
    config = RunConfig(protocol="allreduce", num_workers=4, time_budget_s=1.0, compute_ms=300.0)
    record = simulate(config)
    assert [w["iterations"] for w in record["workers"]] == [3, 3, 3, 3]  # the 4th ends at ~1.2 s
    assert record["heterogeneity_efficiency"] <= 1.0


def test_trace_slowdown_standalone_speed_is_over_the_steps_reached(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("worker,iteration,factor\n" + "".join(f"0,{k},10\n" for k in range(100, 400)))
    config = RunConfig(protocol="prague", num_workers=4, time_budget_s=10.0, compute_ms=50.0,
                       slowdown=f"trace:{trace}")
    record = simulate(config)
    reached = record["workers"][0]["iterations"]  # 100 steps at 1x, then a few at 10x
    own_step_s = 0.05 * (100 + 10 * (reached - 100)) / reached
    assert record["ideal_samples_per_s"] == pytest.approx(config.batch_size * (3 / 0.05 + 1 / own_step_s))
    assert record["heterogeneity_efficiency"] <= 1.0


@pytest.mark.parametrize("flag", ["--latency-us", "--bandwidth-gbps", "--gg-service-us", "--collective-step-us"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_non_finite_network_settings_are_a_one_line_error(flag, value, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["simulate", "--workers", "4", "--iterations", "3", flag, value, "--out", str(out), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and "finite" in err
    assert not out.exists()
    with pytest.raises(UsageError, match="finite"):
        simulate(RunConfig(num_workers=2, iterations=2), SimOptions(network=NetworkParams(latency_us=math.nan)))


def test_no_abort_reported_for_a_kill_after_the_run_ended():
    base = RunConfig(protocol="allreduce", num_workers=4, iterations=10, compute_ms=50.0)
    record = simulate(base.replace(fail="1@3s"))  # the run ends at about 0.5 s
    assert record.get("aborted_at_s") is None and not record.get("workers_lost")
    assert [w["iterations"] for w in record["workers"]] == [10] * 4
    budget = RunConfig(protocol="allreduce", num_workers=4, time_budget_s=1.0, compute_ms=50.0, fail="1@3s")
    assert simulate(budget).get("aborted_at_s") is None  # the budget ends it first
    cut = simulate(base.replace(fail="1@0.2s"))  # a kill during the run still aborts it there
    assert cut["aborted_at_s"] == pytest.approx(0.2) and cut["workers_lost"] == 1


def test_ps_counts_no_computation_after_its_server_died():
    config = RunConfig(protocol="ps", num_workers=4, time_budget_s=2.0, compute_ms=50.0, fail="0@0.52s",
                       on_failure="continue")
    record = simulate(config)
    assert record["aborted_at_s"] == pytest.approx(0.52)
    assert record["heterogeneity_efficiency"] <= 1.0
    assert all(w["iterations"] <= 10 for w in record["workers"])


def test_a_dead_worker_counts_in_the_ideal_only_while_alive():
    config = RunConfig(protocol="prague", num_workers=4, time_budget_s=4.0, compute_ms=50.0, fail="1@0.2s",
                       on_failure="continue")
    record = simulate(config)
    full = 4 * config.batch_size / 0.05
    assert record["ideal_samples_per_s"] == pytest.approx(full * (3 + 0.2 / 4.0) / 4)
    assert record["heterogeneity_efficiency"] > 0.9


def test_fixed_kills_are_kept_however_long_an_iteration_limited_run_lasts():
    """Network time dominates: the run lasts far longer than 10 x its compute, and the kill at 6 s happens."""
    config = RunConfig(protocol="prague", num_workers=4, iterations=10, compute_ms=50.0, workload="synthetic",
                       model_params=100_000, comm={"link_mbps": 1.0}, fail="1@6s", on_failure="continue")
    record = simulate(config, model_params=100_000)
    assert record["workers_lost"] == 1 and record["recoveries"][0]["t_s"] == pytest.approx(6.0)
    assert record["workers"][1]["iterations"] < 10


def test_sweep_with_zero_compute_shows_no_efficiency(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["simulate", "--protocol", "allreduce", "--sweep", "workers=4", "--compute-ms", "0", "--iterations", "5",
            "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    row = json.loads((out / "sweep.json").read_text())["rows"][0]
    assert row["heterogeneity_efficiency"] is None
    assert "| - |" in markdown_table([row])
    assert "efficiency -" in capsys.readouterr().err


def test_sweep_runs_every_check_before_writing_anything(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["simulate", "--protocol", "hop", "--sweep", "workers=16,4", "--slowdown", "10:5x", "--iterations", "5",
            "--out", str(out), "--no-progress"]
    assert main(argv) == 2
    assert "names worker 10" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("protocol", ["prague", "adpsgd", "ps"])
def test_local_work_auto_stops_each_worker_at_its_iterations(protocol):
    config = RunConfig(protocol=protocol, num_workers=4, iterations=40, compute_ms=50.0, slowdown="0:4x",
                       comm={"sync_every": 4, "local_work": "auto"})
    record = simulate(config)
    assert record["local_steps"] == [1, 4, 4, 4]
    assert [w["iterations"] for w in record["workers"]] == [40] * 4


def test_prague_fits_its_communicator_cache_to_comm_memory():
    base = RunConfig(protocol="prague", num_workers=8, iterations=4, compute_ms=50.0, workload="synthetic",
                     model_params=25_000_000, comm={"compression": "int8"}, options={"gg": "random"})
    record = simulate(base, model_params=25_000_000)
    assert record["communicator_cache"] == 21  # 4096 MB over 2 x the 100 MB model, as the runtime fits it
    with pytest.raises(UsageError, match="comm_memory_mb 100"):
        simulate(base.replace(options={"gg": "random", "comm_memory_mb": 100}), model_params=25_000_000)


def test_math_with_local_work_auto_is_refused_for_group_protocols():
    config = RunConfig(protocol="prague", num_workers=4, iterations=8,
                       comm={"sync_every": 4, "local_work": "auto"})
    with pytest.raises(UsageError, match="local_work"):
        simulate(config, SimOptions(math="digits"))


def test_accuracy_curve_is_sized_in_local_steps():
    config = RunConfig(protocol="prague", num_workers=4, iterations=80, compute_ms=50.0,
                       comm={"sync_every": 8})
    record = simulate(config, SimOptions(math="digits"))
    assert len(record["accuracy_curve"]) <= 21


def test_traffic_is_reported_and_allreduce_costs_the_message_as_sent():
    config = RunConfig(protocol="allreduce", num_workers=4, iterations=3, compute_ms=50.0,
                       comm={"compression": "bf16"})
    record = simulate(config)
    assert record["bytes_sent"] > 0
    assert record["bytes_sent_per_sample"] == pytest.approx(record["bytes_sent"] / (12 * config.batch_size))
    assert record["allreduce_s"] < ring_allreduce_s(4, 4.0 * DIGITS_PARAMS, NetworkParams())
