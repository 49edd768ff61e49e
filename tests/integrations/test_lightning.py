"""HetrainStrategy for real: examples/lightning_hop.py on 2 CPU processes that Lightning starts itself.

Each run trains the example's conv net (BatchNorm) on digits for one epoch; every rank
writes its final weights, and the ranks must hold the same floating-point state after
``fit()`` (the integer ``num_batches_tracked`` counts each rank's own batches).
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from hetrain.testing.processes import run_in_own_session

pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lightning_hop.py"
TRAIN_BATCHES = 45  # digits: 1,437 training images in batches of 32
TIMEOUT_S = 120


def run_example(out: Path, *args: str, launcher: tuple[str, ...] = ()) -> str:
    """Run the example (2 ranks, one epoch; ``launcher``: a command to start it under, e.g. torchrun's);
    on failure or timeout kill every process it started."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "RANK",
                                                             "LOCAL_RANK", "NODE_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    command = [*(launcher or (sys.executable,)), str(EXAMPLE), "--devices", "2", "--epochs", "1",
               "--compute-ms", "0", "--out", str(out), *args]
    returncode, output = run_in_own_session(command, cwd=ROOT, env=env, timeout_s=TIMEOUT_S)
    assert returncode == 0, output[-3000:]
    return output


def reports(out: Path, ranks: int = 2) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def assert_ranks_agree(out: Path, ranks: int = 2) -> None:
    states = [torch.load(out / f"rank{r}.pt") for r in range(ranks)]
    for name, tensor in states[0].items():
        if tensor.is_floating_point():
            for other in states[1:]:
                assert torch.equal(tensor, other[name]), f"ranks differ in {name} after fit()"


@pytest.mark.contract
def test_hop_strategy_trains_shares_batches_by_speed_validates_checkpoints_and_ends_in_consensus(processes, tmp_path):
    run_example(tmp_path, "--strategy", "hop", "--checkpoints", str(tmp_path / "ckpt"))
    assert_ranks_agree(tmp_path)
    rank0, rank1 = reports(tmp_path)
    assert rank0["batches"] + rank1["batches"] == TRAIN_BATCHES  # one pass over the data, shared out
    assert rank0["metrics"]["exchanges"] == rank0["batches"]  # every optimizer step synchronized
    assert "val_acc" in rank0["logged"]  # validation ran and logged
    assert rank0["test_accuracy"] > 0.5
    saved = list((tmp_path / "ckpt").glob("*.ckpt"))
    assert len(saved) == 1
    spec = importlib.util.spec_from_file_location("lightning_hop_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    restored = example.DigitsNet.load_from_checkpoint(saved[0], map_location="cpu")
    final = torch.load(tmp_path / "rank0.pt")
    assert set(restored.state_dict()) == set(final)


@pytest.mark.slow  # the fast suite runs the strategy under Lightning's own launcher (above)
def test_prague_strategy_runs_under_torchrun(processes, tmp_path):
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    run_example(tmp_path, "--strategy", "prague", launcher=torchrun)
    assert_ranks_agree(tmp_path)
    reports_ = reports(tmp_path)
    assert sum(r["batches"] for r in reports_) == TRAIN_BATCHES
    assert all(r["metrics"]["groups_formed"] > 0 for r in reports_)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["dpsgd", "allreduce", "prague", "adpsgd", "ps"])
def test_every_other_protocol_trains_under_the_strategy_and_ends_in_consensus(processes, tmp_path, protocol):
    run_example(tmp_path, "--strategy", protocol)
    assert_ranks_agree(tmp_path)
    batches = [r["batches"] for r in reports(tmp_path)]
    if protocol == "allreduce":  # lockstep: Lightning's static shards
        assert batches == [23, 23]
    else:
        assert sum(batches) == TRAIN_BATCHES


def test_only_a_plain_shuffled_distributed_sampler_is_shared_out_by_speed():
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
    from torch.utils.data import DataLoader, DistributedSampler, SubsetRandomSampler, TensorDataset

    from hetrain.integrations.lightning import _training_loader

    data = TensorDataset(torch.zeros(10, 1))
    plain = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, num_replicas=2, rank=0, shuffle=True))
    subset = DataLoader(data, batch_size=2, sampler=DistributedSamplerWrapper(
        SubsetRandomSampler(range(5)), num_replicas=2, rank=0, shuffle=True))  # Lightning's wrapping of a user's
    in_order = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, num_replicas=2, rank=0, shuffle=False))
    assert _training_loader(plain)
    assert not _training_loader(subset)  # SharedBatches would walk the whole dataset, not the subset
    assert not _training_loader(in_order)


def test_only_allreduce_steps_in_lockstep_under_lightning():
    """Decoupled ranks (batches shared by speed, no per-batch collectives) for every protocol but All-Reduce.
    Read off which methods a class overrides, Prague counted as lockstep once it overrode _checkpoint_due."""
    from hetrain.integrations.lightning import lockstep
    from hetrain.registry import PROTOCOLS

    assert {name for name, spec in PROTOCOLS.items() if lockstep(spec.runtime_class())} == {"allreduce"}


EPOCH_END_JOB = Path(__file__).resolve().parent / "lightning_epoch_end_job.py"


def run_epoch_end_job(out: Path, devices: int) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "RANK",
                                                             "LOCAL_RANK", "NODE_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    returncode, output = run_in_own_session([sys.executable, str(EPOCH_END_JOB), "hop", str(out), str(devices)],
                                            cwd=ROOT, env=env, timeout_s=TIMEOUT_S)
    assert returncode == 0, output[-3000:]
    return reports(out, devices)


def assert_epochs_end_as_lightning_ends_them(report: dict) -> None:
    assert report["never_stepped"] == 0, "a partial accumulation window was trained on and never stepped"
    assert report["validated_after"] == report["epoch_ends"], "validation ran before the epoch's last batch"
    assert report["lr"] == pytest.approx(0.01 * 0.5 ** 2), "the epoch-interval scheduler did not step each epoch"


@pytest.mark.slow  # 6-14 s here (Lightning's import in a subprocess): CI's budget; the unit test below is fast
def test_a_rank_s_share_of_a_shared_epoch_ends_as_lightning_ends_an_epoch(processes, tmp_path):
    """The loader's length is the epoch over all ranks, so Lightning's fetcher (which flags the last batch by
    count) never flagged a rank's last one: the epoch ended by StopIteration, without the optimizer step for
    the last, partial accumulation window, without the epoch-interval scheduler's step, and validation went
    by the sampler's claims, which a loader's workers make batches ahead of training (14 of 18 batches).
    One process here; a phantom second rank takes half the shared epoch's batches (the job's callback)."""
    (report,) = run_epoch_end_job(tmp_path, devices=1)
    assert report["batches"] < 2 * report["loader_length"]  # this rank's share: not the loader's length
    assert report["epoch_ends"][0] % 4, "the share must end inside an accumulation window to test it"
    assert_epochs_end_as_lightning_ends_them(report)


@pytest.mark.slow  # two ranks sharing the epochs for real (the fast test above simulates the second)
def test_two_ranks_sharing_epochs_end_them_as_lightning_ends_an_epoch(processes, tmp_path):
    report = run_epoch_end_job(tmp_path, devices=2)
    assert sum(r["batches"] for r in report) == 60  # 2 epochs of 30 batches, shared out
    for rank in report:
        assert_epochs_end_as_lightning_ends_them(rank)


def test_the_shared_loader_knows_a_rank_s_last_batch_though_its_workers_claim_ahead(processes):
    """With workers, the sampler runs out of batches to claim while batches it claimed wait in the workers'
    queue: only the loader's own look-ahead tells which batch it hands out is the rank's last."""
    from torch.utils.data import TensorDataset

    from hetrain.integrations.shared_batches import LastBatchKnown, SharedBatches, with_batch_sampler

    store = torch.distributed.HashStore()
    sampler = SharedBatches(12, 1, store, seed=1)
    loader = with_batch_sampler(torch.utils.data.DataLoader(TensorDataset(torch.arange(12.0)), batch_size=1,
                                                            num_workers=2), sampler, LastBatchKnown)
    flags, exhausted = [], []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for _ in loader:
            flags.append(loader.last)
            exhausted.append(sampler.exhausted)
            store.add(f"epoch/{epoch}", 1)  # another rank takes a batch for each of this one's
        assert flags[-1] and not any(flags[:-1]), flags  # the last batch handed out, and only it
        assert sum(exhausted) > 1  # the sampler ran dry batches before (what validation went by)
        assert sampler.taken == len(flags) < 12
        flags, exhausted = [], []
