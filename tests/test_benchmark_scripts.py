"""Every benchmark script still imports and parses its arguments (they run for hours, not in CI)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_benchmark_script_starts(script):
    done = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()


def test_sim_floor_drives_hop_in_lock_step():
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
