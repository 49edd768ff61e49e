"""HetrainSync for real: examples/accelerate_prague.py on 2 CPU processes started by ``accelerate launch``."""

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from hetrain.testing.processes import run_in_own_session

pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "accelerate_prague.py"
TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prague_around_an_accelerate_loop_leaves_every_process_with_the_same_trained_model(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "RANK",
                                                             "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / "hf"))  # no user config of accelerate's in the way
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_free_port()), str(EXAMPLE), "--epochs", "1", "--out", str(tmp_path)]
    returncode, output = run_in_own_session(command, cwd=ROOT, env=env, timeout_s=TIMEOUT_S)
    assert returncode == 0, output[-3000:]
    states = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for name, tensor in states[0].items():
        if tensor.is_floating_point():
            assert torch.equal(tensor, states[1][name]), f"processes differ in {name}"
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["metrics"]["iterations"] for r in reports] == [23, 23]  # Accelerate's shards: 1,437 images / 2 / 32
    assert all(r["metrics"]["groups_formed"] > 0 for r in reports)  # Prague averaged in groups as it went
    assert reports[0]["test_accuracy"] > 0.5
