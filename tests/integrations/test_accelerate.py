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
TRAIN_BATCHES = 45  # digits: 1,437 training images in batches of 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_example(out: Path, *args: str, epochs: int = 1) -> list[dict]:
    """examples/accelerate_prague.py on 2 processes for ``epochs``; every process's report."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "RANK",
                                                             "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", HF_HOME=str(out / "hf"))  # no user config of accelerate's in the way
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_free_port()), str(EXAMPLE), "--epochs", str(epochs), "--out", str(out), *args]
    returncode, output = run_in_own_session(command, cwd=ROOT, env=env, timeout_s=TIMEOUT_S)
    assert returncode == 0, output[-3000:]
    states = [torch.load(out / f"rank{r}.pt") for r in range(2)]
    for name, tensor in states[0].items():
        if tensor.is_floating_point():
            assert torch.equal(tensor, states[1][name]), f"processes differ in {name}"
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert reports[0]["test_accuracy"] > 0.5
    return reports


@pytest.mark.contract
def test_prague_around_an_accelerate_loop_shares_the_epoch_and_leaves_every_process_with_the_same_model(processes, tmp_path):
    reports = run_example(tmp_path, "--protocol", "prague")
    assert sum(r["batches"] for r in reports) == TRAIN_BATCHES  # one pass over the data, shared out by speed
    assert all(r["metrics"]["iterations"] == r["batches"] for r in reports)  # every step synchronized
    assert all(r["metrics"]["groups_formed"] > 0 for r in reports)  # Prague averaged in groups as it went
    assert all(r["losses_logged"] == r["batches"] for r in reports)  # gather_for_metrics inside the block: local


@pytest.mark.slow
def test_hop_over_accelerates_prepared_loader_keeps_its_static_shards(processes, tmp_path):
    reports = run_example(tmp_path, "--protocol", "hop", "--static-shards")
    assert [r["metrics"]["iterations"] for r in reports] == [23, 23]  # Accelerate's shards: 1,437 images / 2 / 32


@pytest.mark.slow  # CI time (19 s): Lightning's checkpoint resume stays in the fast set
def test_save_state_and_load_state_carry_the_protocols_state_and_the_shared_loaders_epoch(processes, tmp_path):
    """accelerator.register_for_checkpointing(sync): a run resumed by load_state goes on counting from
    the saved iteration (rank 0's, as the model is) and its shared loader from the saved epoch."""
    first = run_example(tmp_path / "a", "--protocol", "prague", "--save-state", str(tmp_path / "state"))
    second = run_example(tmp_path / "b", "--protocol", "prague", "--load-state", str(tmp_path / "state"))
    saved = first[0]["metrics"]["iteration"]
    assert saved > 0
    for report in second:
        assert report["resumed_iteration"] == saved
        assert report["metrics"]["iteration"] > saved
        assert report["loader_epoch"] == 2  # epoch 0 was the first run's; this run's one epoch was epoch 1


@pytest.mark.slow  # CI time (10 s)
def test_gradient_accumulation_and_a_prepared_one_cycle_schedule_follow_the_shared_epochs(processes, tmp_path):
    """accelerator.accumulate(model) with 2 steps and a OneCycleLR through accelerator.prepare, sized as
    Accelerate's docs size it (the epoch's batches x epochs / accumulation): the processes take unequal
    shares, sync only on real optimizer steps, and both end at the end of the schedule."""
    reports = run_example(tmp_path, "--protocol", "prague", "--accumulate", "2", "--one-cycle",
                          "--slowdown", "0:3x", "--compute-ms", "5", epochs=2)
    assert sum(r["batches"] for r in reports) == 2 * TRAIN_BATCHES
    assert reports[0]["batches"] < reports[1]["batches"]  # process 0 is 3x slower: fewer batches
    for r in reports:
        assert r["schedule"]["last_epoch"] == r["schedule"]["total_steps"] == 2 * TRAIN_BATCHES // 2
        assert r["metrics"]["iterations"] == r["batches"] // 2  # only real optimizer steps synchronize
