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
