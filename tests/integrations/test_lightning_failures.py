"""HetrainStrategy with ``on_failure="continue"``: a rank SIGKILLed by pid mid-fit, the survivors finish.

Lightning's own launcher kills every rank when one dies; the strategy's launcher leaves
that out, and each rank learns of deaths from heartbeats on the job's store.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetrain.testing.processes import rank_pids

pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lightning_hop.py"
TIMEOUT_S = 150

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds ranks in /proc")]


@pytest.mark.parametrize("protocol", ["hop", "prague"])
def test_a_rank_killed_mid_fit_leaves_the_survivors_finishing_in_consensus(processes, tmp_path, protocol):
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "RANK",
                                                             "LOCAL_RANK", "NODE_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, str(EXAMPLE), "--strategy", protocol, "--devices", "3", "--epochs", "8",
               "--compute-ms", "30", "--slowdown", "none", "--on-failure", "continue", "--out", str(tmp_path)]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (tmp_path / "started.rank2").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "rank 2 never started training"
            time.sleep(0.05)
        time.sleep(1.0)
        victim = rank_pids(proc.pid, "LOCAL_RANK").get(2)  # the rank Lightning started
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        output = proc.communicate(timeout=TIMEOUT_S)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0, output[-3000:]
    assert not (tmp_path / "rank2.json").exists()
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    if protocol == "hop":  # Hop repairs its ring around the dead (Prague's GG just stops grouping it)
        for report in reports:
            assert report["metrics"]["workers_known_dead"] == [2]
    states = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for name, tensor in states[0].items():
        if tensor.is_floating_point():
            assert torch.equal(tensor, states[1][name]), f"survivors differ in {name}"
    assert reports[0]["test_accuracy"] > 0.5
