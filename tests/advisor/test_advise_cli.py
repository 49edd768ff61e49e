"""`hetrain advise` end to end: a short real measurement, the simulated candidates, the JSON record."""

import json
import shlex
import subprocess
import sys

from hetrain.cli import build_parser


def test_advise_measures_simulates_and_recommends_a_command_that_parses(processes, tmp_path):
    """Real compute (no --compute-ms): the speeds exist only in the measurement, so predictions made from
    the flags' default instead would miss the measured rate by far."""
    out = tmp_path / "advice.json"
    done = subprocess.run([sys.executable, "-m", "hetrain", "advise", "--workers", "3", "--slowdown", "0:5x",
                           "--time-budget", "20", "--measure-s", "1.5", "--json", str(out)],
                          capture_output=True, text=True, timeout=55)
    assert done.returncode == 0, done.stderr[-2000:]
    advice = json.loads(out.read_text())
    profile = advice["profile"]
    assert profile["num_workers"] == 3 and profile["measured_protocol"] == "allreduce"
    assert len(profile["compute_ms"]) == 3 and profile["model_params"] == 4810  # the digits MLP
    assert profile["compute_ms"][0] > 2 * max(profile["compute_ms"][1:]), profile["compute_ms"]
    names = {c["name"] for c in advice["candidates"]}
    assert {"allreduce", "dpsgd topology=ring", "hop topology=ring backup=0", "hop topology=ring backup=1",
            "prague group_size=2 gg=smart"} <= names
    for c in advice["candidates"]:
        assert c["samples_per_s"] > 0 and c["bytes_per_sample"] > 0 and "heterogeneity_efficiency" in c
    reached = [c["time_to_target_s"] for c in advice["candidates"] if c["time_to_target_s"] is not None]
    assert reached and reached == sorted(reached), "those predicted to reach the target come first, soonest first"
    allreduce = next(c for c in advice["candidates"] if c["name"] == "allreduce")
    ratio = allreduce["samples_per_s"] / profile["measured_samples_per_s"]
    assert 0.33 < ratio < 3.0, f"allreduce predicted {ratio:.2f}x what the measuring all-reduce run did"
    words = shlex.split(advice["recommended"]["command"])
    args = build_parser().parse_args(words[1:])
    assert (args.command, args.protocol, args.workers, args.slowdown) == (
        "train", advice["recommended"]["protocol"], 3, "0:5x")
    assert advice["recommended"]["command"] in done.stdout and "why: " in done.stdout


def test_bad_input_is_one_line_and_exit_2_before_anything_starts(processes, tmp_path):
    for args, message in ((["--measure-s", "0"], "--measure-s must be > 0"),
                          (["--json", str(tmp_path / "none" / "a.json")], "does not exist"),
                          (["--workload", "lm"], "advise simulates")):
        done = subprocess.run([sys.executable, "-m", "hetrain", "advise", "--workers", "2", "--time-budget", "5",
                               *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_train_protocol_auto_says_what_it_chose_and_keeps_the_choice_in_the_record(processes, tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "hetrain", "train", "--protocol", "auto", "--workers", "3",
                           "--slowdown", "0:5x", "--compute-ms", "20", "--iterations", "8", "--measure-s", "1",
                           "--no-progress", "--out", str(out)], capture_output=True, text=True, timeout=55)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((out / "metrics.json").read_text())
    chosen = record["advice"]["recommended"]
    assert record["protocol"] == chosen["protocol"] != "allreduce"
    assert record["config"]["options"] == chosen["options"]
    assert record["advice"]["profile"]["compute_ms"][0] > 3 * record["advice"]["profile"]["compute_ms"][1]
    line = next(line for line in done.stdout.splitlines() if line.startswith("auto: "))
    assert chosen["name"] in line and "why:" in line
