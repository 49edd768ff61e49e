"""The same entry points run unchanged under torchrun: single node, and two "nodes" on localhost."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# PyTorch 2.13 sometimes aborts a gloo worker during interpreter finalization, after all
# work is done (reproduced with a plain DDP script; docs/decisions.md). hetrain's own
# torchrun entry leaves without finalization; a user's script (the example) may still hit it.
KNOWN_TEARDOWN_ABORT = "terminate called without an active exception"


def _run_all(commands, timeout_s=150, tolerate_teardown_abort=False):
    """Start every command, wait for all; on failure or timeout kill every process group."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True) for c in commands]
    try:
        outputs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    except subprocess.TimeoutExpired:
        outputs = None
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert outputs is not None, "torchrun job timed out"
    for p, out in zip(procs, outputs):
        if tolerate_teardown_abort and p.returncode != 0 and KNOWN_TEARDOWN_ABORT in out:
            continue  # the results are checked by the caller
        assert p.returncode == 0, out[-3000:]
    return outputs


def test_example_user_loop_under_torchrun(tmp_path):
    report = tmp_path / "report.json"
    _run_all([TORCHRUN + ["--standalone", "--nproc-per-node", "3", "examples/train_custom.py",
                          "--steps", "80", "--out", str(report)]], tolerate_teardown_abort=True)
    ranks = json.loads(report.read_text())
    assert [r["rank"] for r in ranks] == [0, 1, 2]
    assert len({r["digest"] for r in ranks}) == 1  # finish() left every rank with the same model
    assert ranks[0]["loss"] < 0.5  # it learned (the loss starts near 6)
    assert all(r["iterations"] >= 1 and "wait_s" in r for r in ranks)


@pytest.mark.parametrize("protocol", ["hop", "prague"])
def test_hetrain_train_on_two_nodes_of_localhost(tmp_path, protocol):
    port = _free_port()
    out = tmp_path / "run"
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "hetrain-test", "-m", "hetrain", "train",
              "--protocol", protocol, "--iterations", "30", "--compute-ms", "5", "--out", str(out)]
    outputs = _run_all([TORCHRUN + ["--node-rank", "0"] + common, TORCHRUN + ["--node-rank", "1"] + common])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_workers"] == 4
    assert [w["rank"] for w in metrics["workers"]] == [0, 1, 2, 3]
    assert all(w["iteration"] >= 30 for w in metrics["workers"])
    assert "heterogeneity efficiency" in "".join(outputs)
