"""`hetrain train` and `simulate` with local steps, compression and emulated links: errors and records."""

import json

import pytest

from hetrain.cli import main


@pytest.mark.parametrize("args, message", [
    (["--sync-every", "0"], "--sync-every must be a positive integer"),
    (["--local-work", "auto"], "--local-work auto sizes the local steps"),
    (["--compress", "topk:2"], "the fraction must be in (0, 1)"),
    (["--compress", "gzip"], "unknown compression 'gzip'"),
    (["--link-mbps", "fast"], "malformed --link-mbps 'fast'"),
    (["--link-mbps", "9:10", "--workers", "4"], "names worker 9"),
    (["--link-latency-ms", "-3"], "--link-latency-ms '-3'"),
    (["--gossip-step", "2"], "--gossip-step must be in (0, 1]"),
    (["--outer-momentum", "1"], "--outer-momentum must be in [0, 1)"),
    (["--protocol", "allreduce", "--sync-every", "4"], "allreduce (DDP) averages gradients at every step"),
    (["--protocol", "allreduce", "--compress", "int8"], "torch's own hooks"),
    (["--protocol", "prague", "--gg", "static", "--sync-every", "4", "--local-work", "auto"], "static schedule"),
    (["--protocol", "hop", "--late-updates", "progress", "--compress", "int8"], "compressed gossip mixes public"),
])
def test_bad_communication_settings_are_one_line_errors(capsys, tmp_path, args, message):
    out = tmp_path / "out"
    code = main(["train", "--out", str(out), "--iterations", "3", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_train_records_what_it_sent(processes, tmp_path):
    out = tmp_path / "run"
    code = main(["train", "--protocol", "hop", "--workers", "3", "--iterations", "24", "--sync-every", "4",
                 "--compress", "int8", "--outer-optimizer", "nesterov", "--link-mbps", "1000", "--no-progress",
                 "--out", str(out)])
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["bytes_sent"] > 0 and metrics["bytes_sent_per_sample"] > 0
    assert metrics["compression_ratio"] > 2.5  # int8, with a keyframe to each neighbour
    assert metrics["config"]["sync_every"] == 4 and metrics["config"]["compression"] == "int8"
    for worker in metrics["workers"]:
        assert {"bytes_sent", "bytes_received", "link_s"} <= set(worker)
        assert worker["exchanges"] * 4 <= worker["iterations"] + 4 and worker["outer_steps"] == worker["exchanges"]
    assert "bytes/sample" in (out / "summary.txt").read_text()


def test_the_simulator_models_local_steps_compression_and_links(tmp_path):
    records = {}
    for name, extra in (("plain", []), ("h8-int8", ["--sync-every", "8", "--compress", "int8"])):
        out = tmp_path / name
        assert main(["simulate", "--protocol", "hop", "--workers", "8", "--slowdown", "0:5x", "--compute-ms", "50",
                     "--time-budget", "30", "--link-mbps", "1", "--no-progress", "--out", str(out), *extra]) == 0
        records[name] = json.loads((out / "metrics.json").read_text())
    plain, fast = records["plain"], records["h8-int8"]
    assert plain["messages"] > 0 and fast["local_steps"] == [8] * 8
    # 1 Mbit/s holds a 19 KB message 0.15 s: plain hop is link-bound, H=8 with int8 is not
    assert fast["samples_per_s"] > 3 * plain["samples_per_s"]
    assert main(["simulate", "--iterations", "5", "--outer-optimizer", "nesterov", "--sync-every", "2",
                 "--out", str(tmp_path / "x"), "--no-progress"]) == 2
