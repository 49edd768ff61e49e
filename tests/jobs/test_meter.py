"""Speed and memory over time: windows, job series, quarters; bounded snapshots (emulated compute:
tests/jobs/test_emulation.py)."""

import math

import pytest
import torch

from hetrain.jobs.meter import WindowMeter, peak_rss_mb, rss_mb, tcp_connections
from hetrain.jobs.snapshots import MAX_SNAPSHOTS, SnapshotKeeper
from hetrain.metrics import build_metrics, job_series, quarter_rates, rss_at, rss_median


def test_window_meter_rates_losses_and_empty_windows():
    meter = WindowMeter(window_s=5.0)
    for t in (1.0, 2.0, 3.0):  # 3 iterations of 32 samples in the first window
        meter.record(t, 32, loss=2.0)
    meter.record(12.0, 32, loss=1.0)  # ends past two boundaries: windows 1 and 2 close first
    series = meter.finish(13.0)
    assert [p["t_s"] for p in series] == [5.0, 10.0, 13.0]
    assert series[0]["samples_per_s"] == pytest.approx(96 / 5) and series[0]["train_loss"] == 2.0
    assert series[1]["samples_per_s"] == 0.0 and series[1]["train_loss"] is None
    assert series[2]["samples_per_s"] == pytest.approx(32 / 3) and series[2]["train_loss"] == 1.0
    assert all(p["rss_mb"] > 0 for p in series)


def test_rss_readings_are_plausible():
    assert 10 < rss_mb() <= peak_rss_mb() * 1.01 + 1


@pytest.mark.skipif(tcp_connections() is None, reason="needs Linux /proc")
def test_tcp_connections_counts_this_processs_established_sockets(loopback):
    import socket

    before = tcp_connections()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            with accepted:
                assert tcp_connections() == before + 2  # both ends live in this process
                assert client.fileno() >= 0
    assert tcp_connections() == before


def test_job_series_sums_samples_over_each_window_to_the_job_s_end():
    """Fast workers that stopped at 1.6 s (one short window each) beside a slow one's whole 5 s window: the
    rates were summed as they were and the series stopped at the shortest worker (9,629 samples/s where the
    job did 3,661, and the logged efficiency 0.93 where the run's was 0.30)."""
    def window(t, length, rate):
        return {"t_s": t, "window_s": length, "samples_per_s": rate, "rss_mb": 100.0}

    fast = [window(1.6, 1.6, 4800.0)]  # 7,680 samples, then it stopped
    slow = [window(5.0, 5.0, 781.0), window(10.0, 5.0, 781.0)]
    series = job_series([fast, fast, slow])
    assert [p["samples_per_s"] for p in series] == [pytest.approx((2 * 7680 + 3905) / 5), pytest.approx(781.0)]
    assert [p["rss_mb"] for p in series] == [300.0, 100.0]  # the stopped workers' memory is gone


def test_job_series_leaves_out_partial_last_windows():
    def window(t, length, rate):
        return {"t_s": t, "window_s": length, "samples_per_s": rate, "rss_mb": 1.0}

    a = [window(5.0, 5.0, 100.0), window(10.0, 5.0, 100.0), window(10.01, 0.01, 3200.0)]  # one step in 10 ms
    b = [window(5.0, 5.0, 100.0), window(10.0, 5.0, 100.0), window(12.0, 2.0, 100.0)]
    series = job_series([a, b])
    assert [p["samples_per_s"] for p in series] == [200.0, 200.0]  # no burst at the end
    meter = WindowMeter(window_s=5.0)
    meter.record(1.0, 32)
    meter.record(5.5, 32)
    assert [p["window_s"] for p in meter.finish(5.51)] == [5.0, 0.51]


def test_quarter_rates_weight_windows_by_overlap():
    series = [{"t_s": 10.0 * (i + 1), "samples_per_s": rate, "rss_mb": 1.0} for i, rate in enumerate([4, 8, 8, 2])]
    first, last = quarter_rates(series)  # quarters of 40 s are exactly the first and last windows
    assert first == pytest.approx(4) and last == pytest.approx(2)
    series = [{"t_s": 3.0, "samples_per_s": 10.0, "rss_mb": 1.0}, {"t_s": 4.0, "samples_per_s": 20.0, "rss_mb": 1.0}]
    first, last = quarter_rates(series)  # first quarter [0, 1) inside window 1; last [3, 4) is window 2
    assert first == pytest.approx(10) and last == pytest.approx(20)
    assert rss_at(series, 3.5) == 1.0 and rss_at(series, 60) is None


def test_metrics_report_quarters_only_with_enough_windows():
    def worker(n_windows):
        series = [{"t_s": 5.0 * (i + 1), "samples_per_s": 100.0, "rss_mb": 10.0, "train_loss": 0.5}
                  for i in range(n_windows)]
        return {"iterations": 10, "compute_s": 1.0, "wait_s": 0.0, "throughput_series": series, "peak_rss_mb": 12.0}

    short = build_metrics(protocol="hop", workers=[worker(3)], wall_time_s=15, batch_size=32,
                          standalone_iteration_s=[0.05])
    assert "samples_per_s_first_quarter" not in short and short["peak_rss_mb_max_worker"] == 12.0
    long = build_metrics(protocol="hop", workers=[worker(16), worker(16)], wall_time_s=80, batch_size=32,
                         standalone_iteration_s=[0.05, 0.05])
    assert long["samples_per_s_first_quarter"] == pytest.approx(200.0)
    assert long["rss_mb_all_workers_at_1min"] == 20.0 and long["final_train_loss"] == 0.5


def test_time_to_target_by_loss_when_a_target_loss_is_given():
    curve = [{"t_s": 1.0, "accuracy_avg_model": 0.99, "loss_avg_model": 3.0},
             {"t_s": 2.0, "accuracy_avg_model": 0.2, "loss_avg_model": 2.4}]
    kwargs = dict(protocol="hop", workers=[{"iterations": 1, "compute_s": 1, "wait_s": 0}], wall_time_s=2,
                  batch_size=1, standalone_iteration_s=[1.0], accuracy_curve=curve, target_accuracy=0.95)
    assert build_metrics(**kwargs)["time_to_target_s"] == 1.0
    assert build_metrics(**kwargs, target_loss=2.5)["time_to_target_s"] == 2.0


def test_snapshots_stay_within_their_budget_by_thinning():
    model_bytes = 1000
    keeper = SnapshotKeeper(interval_s=0.5, model_bytes=model_bytes, budget_bytes=16 * model_bytes)
    t = 0.0
    while t < 100:
        keeper.maybe_take(t, int(t), lambda: torch.zeros(250))
        t += 0.1
    assert len(keeper.snapshots) < 16 and keeper.interval_s > 0.5
    dues = [s[0] for s in keeper.snapshots]
    assert dues == sorted(dues) and dues[0] == 0.0 and dues[-1] > 50  # still covers the whole run
    keeper.take_final(100.0, 100, lambda: torch.zeros(250))
    assert keeper.snapshots[-1][0] == math.inf
    assert not SnapshotKeeper(0.5, model_bytes=10**9).enabled  # too big for 8 snapshots: none


def test_a_small_models_snapshots_stop_growing_however_long_the_run():
    keeper = SnapshotKeeper(interval_s=0.5, model_bytes=20_000)  # the digits MLP: the byte budget holds 13,000
    counts = []
    for tick in range(4 * 3600 * 2):  # four hours of 0.5 s ticks
        keeper.maybe_take(tick * 0.5, tick, lambda: None)
        if tick % 1200 == 0:
            counts.append(len(keeper.snapshots))
    assert max(counts) <= MAX_SNAPSHOTS and min(counts[1:]) >= MAX_SNAPSHOTS // 2  # bounded, never emptied
    assert keeper.snapshots[0][0] == 0.0 and keeper.snapshots[-1][0] > 3.9 * 3600  # still the whole run


def test_rss_median_reads_a_minute_not_one_window():
    # a worker whose buffers come and go: 620 or 840 MB on alternate readings, no trend
    series = [{"t_s": 5.0 * (i + 1), "rss_mb": 620.0 if i % 2 else 840.0} for i in range(48)]
    single = (rss_at(series, 235.0) - rss_at(series, 60.0)) / rss_at(series, 60.0)
    assert abs(single) > 0.3  # two single readings see a 35% "change"
    assert rss_median(series, 60.0, 120.0) == rss_median(series, 180.0, 240.0) == 730.0
    leaking = [{"t_s": 5.0 * (i + 1), "rss_mb": 600.0 + i} for i in range(48)]
    assert rss_median(leaking, 180.0, 240.0) - rss_median(leaking, 60.0, 120.0) == 24.0  # a trend still shows
    assert rss_median(series, 300.0, 360.0) is None
