"""--resume after a death at any moment (issue 25): before some workers' first checkpoint, and
while a checkpoint was being written (its temporary file left behind)."""

import pytest
import torch

from hetrain.config import RunConfig
from hetrain.jobs import checkpoint

CONFIG = RunConfig(protocol="hop", num_workers=3, compute_ms=20.0, iterations=50)


def _fresh(directory) -> None:
    assert checkpoint.prepare(str(directory), CONFIG, resume=True) is False
    checkpoint.start(str(directory), CONFIG, resumed=False)


def _state(iteration: int) -> dict:
    return {"iteration": iteration, "model": {"w": torch.zeros(2)}}


def test_a_death_before_every_worker_wrote_a_checkpoint_restarts_all_afresh(tmp_path):
    directory = tmp_path / "ckpt"
    _fresh(directory)
    checkpoint.save_worker(directory, 0, _state(40))
    checkpoint.save_worker(directory, 2, _state(38))  # worker 1 died before its first checkpoint
    with pytest.warns(UserWarning, match="2 of 3 workers had written a checkpoint"):
        assert checkpoint.prepare(str(directory), CONFIG, resume=True) is False
    checkpoint.start(str(directory), CONFIG, resumed=False)
    assert not list(directory.glob("worker-*.pt"))  # no worker resumes from another run's file
    for rank in range(3):
        checkpoint.save_worker(directory, rank, _state(5))
    assert checkpoint.prepare(str(directory), CONFIG, resume=True) is True


def test_a_write_cut_short_by_a_death_is_neither_read_nor_left_behind(tmp_path):
    directory = tmp_path / "ckpt"
    _fresh(directory)
    for rank in range(3):
        checkpoint.save_worker(directory, rank, _state(10 + rank))
    partial = directory / ".worker-1.pt.k3j2x"  # save_worker's temporary name, as a SIGKILL mid-write leaves it
    partial.write_bytes(b"\x80\x02half a pickle")
    assert checkpoint.prepare(str(directory), CONFIG, resume=True) is True
    checkpoint.start(str(directory), CONFIG, resumed=True)
    assert not partial.exists()
    assert checkpoint.load_worker(directory, 1)["iteration"] == 11  # the last complete write
