"""A checkpoint loaded inside a running HetrainSync block is a full state (issue 68, item 7): the shared
loader's epoch goes back to the saved one, and the next pass over it is a full pass (it yielded 0 batches
on every process: its batches in the job's store had been claimed)."""

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from hetrain.testing.processes import run_in_own_session

pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("accelerate_reload_job.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("protocol", ["hop", pytest.param("prague", marks=pytest.mark.slow)])
def test_a_state_loaded_inside_the_block_rewinds_the_shared_epoch_to_a_full_pass(processes, tmp_path, protocol):
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "RANK",
                                                             "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / "hf"))
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_free_port()), str(JOB), "--protocol", protocol,
               "--state", str(tmp_path / "state"), "--out", str(tmp_path)]
    returncode, output = run_in_own_session(command, cwd=ROOT, env=env, timeout_s=50)
    assert returncode == 0, output[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    per_pass = [sum(r["per_pass"][number] for r in reports) for number in range(3)]
    assert per_pass == [4, 4, 4], (per_pass, reports)  # plain Accelerate: [4, 4, 4]; it read [4, 4, 0]
