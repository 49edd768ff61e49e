"""Every benchmark script still imports and parses its arguments (they run for hours, not in CI)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


# Every script's ``--help`` in one interpreter (torch imported once: CI time), each as ``__main__`` in turn;
# what each printed and how it exited, by name, as JSON on the last line.
_HELP_ALL = """
import contextlib, io, json, runpy, sys
results = {}
for path in sys.argv[1:]:
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [path, "--help"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:
            code, _ = 1, err.write(repr(exc))
    results[path] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()[-2000:]}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def helps() -> dict:
    done = subprocess.run([sys.executable, "-c", _HELP_ALL, *map(str, SCRIPTS)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_benchmark_script_starts(processes, script, helps):
    result = helps[str(script)]
    assert result["code"] == 0, result["stderr"]
    assert "usage" in result["stdout"].lower()


def test_sim_floor_drives_hop_in_lock_step(processes):
    """The floor benchmark's loop is a valid schedule: every worker is ready every iteration (it asserts so)
    and prints one row per protocol."""
    done = subprocess.run([sys.executable, "benchmarks/sim_bench.py", "floor", "--workers", "16", "--iterations", "20"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| hop |") or line.startswith("| dpsgd |")]
    assert [row.split("|")[2].strip() for row in rows] == ["16", "16"]


def test_prague_bench_configurations_are_valid_runs():
    """prague_bench runs for hours, so CI checks what it would run: every configuration validates."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import prague_bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    runs = prague_bench.straggler_runs(["smart", "random"], [2, 3])
    assert list(runs) == ["allreduce", "prague smart", "prague random", "prague smart, s=3"]
    for fields in runs.values():
        prague_bench._config(slowdown="0:5x", time_budget_s=1.0, **fields).validate()


def test_soak_bench_routes_communication_settings_to_comm():
    """``--option compression=int8`` is a communication setting: it goes to RunConfig.comm (as a protocol
    option the run was refused with a traceback), and a protocol option stays an option."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import soak_bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    options, comm = soak_bench.split_options(dict(soak_bench._option(t) for t in ("compression=int8", "max_ig=4",
                                                                                  "sync_every=8")))
    assert options == {"max_ig": 4} and comm == {"compression": "int8", "sync_every": 8}
    from hetrain.config import RunConfig
    RunConfig(protocol="hop", num_workers=2, time_budget_s=1.0, options=options, comm=comm).validate()


def test_soak_bench_tells_a_step_from_a_leak():
    """A job whose memory steps up once in minute 3 (a cache filling) and then holds reads growth from the
    2nd minute but none over its second half; one that grows every minute (a leak) reads both. RSS 1,000
    MB, 5 s windows, 8 minutes; a worker's series is the job's when there is one worker."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import soak_bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def record(rss_at):
        series = [{"t_s": t, "window_s": 5.0, "samples_per_s": 100.0, "rss_mb": rss_at(t)} for t in range(5, 481, 5)]
        return {"protocol": "prague", "wall_time_s": 480.0, "workers": [{"throughput_series": series}]}

    step = soak_bench.row_of("mlp", 1, record(lambda t: 1000.0 if t <= 150 else 1200.0))
    leak = soak_bench.row_of("mlp", 1, record(lambda t: 1000.0 + t))
    assert step["rss_growth"] == pytest.approx(0.2) and step["rss_growth_second_half"] == pytest.approx(0.0)
    assert leak["rss_growth"] > 0.05 and leak["rss_growth_second_half"] > 0.05
    assert "| +20.0% | +0.0% |" in soak_bench.markdown([step])
    assert soak_bench.row_of("mlp", 1, record(lambda t: 1000.0))["rss_growth_second_half"] == 0.0
    short = record(lambda t: 1000.0)
    short["workers"][0]["throughput_series"] = short["workers"][0]["throughput_series"][:36]  # 3 minutes
    assert soak_bench.row_of("mlp", 1, short)["rss_growth_second_half"] is None


def test_comm_bench_rounds_report_medians_and_rounds_won():
    """``comm_bench.py outer --rounds N``: each protocol's median time to 95% with nesterov and with none,
    a run that never reached it counting as the slowest, and the rounds in which nesterov was no later."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import comm_bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    worst = {"nesterov": [10.0, None, 12.0], "none": [11.0, 9.0, 13.0]}
    averaged = {"nesterov": [5.0, 6.0, 7.0], "none": [6.0, 6.5, 6.0]}
    rows = [{"name": f"hop-{arm}", "round": k + 1, "time_to_target_s": averaged[arm][k],
             "time_to_target_worst_worker_s": worst[arm][k]} for k in range(3) for arm in ("nesterov", "none")]
    rows.append({"name": "prague-nesterov", "round": 1, "time_to_target_s": 1.0, "time_to_target_worst_worker_s": 1.0})
    (line,) = comm_bench.outer_rounds(rows)  # prague: one side of one round only, no line
    assert line.startswith("hop over 3 rounds")
    assert "averaged model: median 6.0 s vs 6.0 s (met by the median), no later in 2 of 3 rounds" in line
    assert "worst worker: median 12.0 s vs 11.0 s (MISSED by the median), no later in 2 of 3 rounds" in line
    assert comm_bench._median([None, None, 3.0]) is None
    assert comm_bench._median([4.0, 2.0, 3.0, 1.0]) == 2.5


def test_codec_bench_times_every_code_and_reports_its_bytes(processes, tmp_path):
    """``codec_bench.py``: a row per code with its payload's bytes per value (int8 about 1 + a scale per
    256 values, the one-bit code about an eighth) and positive encode and decode times, as JSON and markdown."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "codec_bench.py"), "--numel", "4096",
                           "--repeats", "2", "--codes", "int8,one-bit", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["code"]: r for r in json.loads((tmp_path / "codec.json").read_text())["rows"]}
    assert rows["int8"]["bytes_per_value"] == (4096 + 4 * 16) / 4096
    assert rows["one-bit"]["bytes_per_value"] == (4096 / 8 + 4 * 16) / 4096
    assert all(r["encode_ms"] > 0 and r["decode_ms"] > 0 for r in rows.values())
    assert "| one-bit | 4,096 |" in (tmp_path / "codec.md").read_text()
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "codec_bench.py"), "--codes", "int9",
                          "--out", str(tmp_path / "bad")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "int9" in bad.stderr and not (tmp_path / "bad").exists()


def test_comm_bench_options_reach_every_run_and_a_bad_one_stops_all_before_the_first(processes, tmp_path):
    """``--option``: a protocol option goes to RunConfig.options and a communication setting overrides the
    plan's; an option one planned run does not take stops the benchmark (exit 2) before any run or file."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import comm_bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    fields = dict(comm_bench.plan("outer"))["prague-nesterov"]
    config = comm_bench.config_of(fields, 30.0, 60.0, {"preduce_overlap": 0}, {"compression": "int4"})
    config.validate()
    assert config.options == {"preduce_overlap": 0} and config.protocol == "prague"
    assert config.comm["compression"] == "int4" and config.comm["sync_every"] == 8
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "comm_bench.py"), "outer", "--option",
                           "preduce_overlap=0", "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "run dpsgd-nesterov" in done.stderr and "preduce_overlap" in done.stderr
    assert not (tmp_path / "out").exists()
    for plan_name, _ in comm_bench.plan("outer-complete"):  # the plan's own options kept under --option
        fields = dict(comm_bench.plan("outer-complete"))[plan_name]
        config = comm_bench.config_of(fields, 30.0, 60.0, {}, {"compression": "int4"})
        config.validate()
        assert config.options == {"topology": "complete"}


def test_option_texts_are_read_as_their_flags_read_them():
    """``NAME=VALUE``: a setting by its flag's type (an integer for sync_every, text for compression),
    a protocol option guessed (false is False, not the truthy text), and bad text a one-line UsageError."""
    from hetrain.comm.option_text import parse_option, split_options
    from hetrain.errors import UsageError

    named = dict(parse_option(t) for t in ("sync_every=8", "compression=4", "outer_lr=0.5", "max_ig=4",
                                           "late_updates=progress", "flag=false"))
    options, comm = split_options(named)
    assert comm == {"sync_every": 8, "compression": "4", "outer_lr": 0.5}
    assert options == {"max_ig": 4, "late_updates": "progress", "flag": False}
    for bad in ("sync_every", "=3"):
        with pytest.raises(UsageError, match="NAME=VALUE"):
            parse_option(bad)
    with pytest.raises(UsageError, match="sync_every takes an integer"):
        split_options({"sync_every": "x"})
