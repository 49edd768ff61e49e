"""Fidelity: `hetrain simulate` against `hetrain train` on the same settings (4 workers, 5x straggler).

A real run's rate depends on the machine's load (a wall-clock measurement, not a
behaviour), so this is a slow check, kept out of the default suite:
`scripts/test -m slow tests/sim`. docs/guides/simulator.md records the full 4- and
8-worker comparison (benchmarks/sim_bench.py fidelity).
"""

import json

import pytest

from hetrain.cli import main

FLAGS = {"allreduce": [], "dpsgd": [], "hop": [],
         "prague": ["--gg", "smart"], "adpsgd": [], "ps": []}
TOLERANCE = 0.15


def _run(command, protocol, out):
    argv = [command, "--protocol", protocol, "--workers", "4", "--compute-ms", "50", "--slowdown", "0:5x",
            "--time-budget", "3", *FLAGS[protocol], "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.slow  # wall-clock: a real run's rate depends on what else the machine is doing
@pytest.mark.parametrize("protocol", list(FLAGS))
def test_simulated_rates_within_15_percent_of_a_real_run(processes, protocol, tmp_path):
    real = _run("train", protocol, tmp_path / "train")
    sim = _run("simulate", protocol, tmp_path / "sim")
    assert sim["samples_per_s"] == pytest.approx(real["samples_per_s"], rel=TOLERANCE)
    assert sim["heterogeneity_efficiency"] == pytest.approx(real["heterogeneity_efficiency"], rel=TOLERANCE)
