"""What each worker samples: its own shard (the default) or the whole training set (``--data-split whole``)."""

import json

import pytest
import torch

from hetrain import data as data_plane
from hetrain.config import RunConfig
from hetrain.data import load_dataset
from hetrain.jobs import checkpoint
from hetrain.protocols.options import OptionError


def _rows_seen(sampler, data, draws=200):
    """Indices into the training set of every sample ``sampler`` drew (digits rows are distinct)."""
    index = {tuple(row.tolist()): i for i, row in enumerate(data.x_train)}
    return {index[tuple(row.tolist())] for _ in range(draws) for row in sampler.next()[0]}


def test_a_shard_is_its_slice_and_the_whole_split_reaches_every_sample_with_each_workers_own_seed():
    data = load_dataset("mlp")
    n = len(data.x_train)
    shard = _rows_seen(data_plane.make_sampler("mlp", data, 1, 4, 32, 0), data)
    assert shard == set(range(1, n, 4))  # worker 1 of 4: rows 1, 5, 9, ... and no other
    whole = [data_plane.make_sampler("mlp", data, rank, 4, 32, 0, split="whole") for rank in (0, 1)]
    assert _rows_seen(whole[1], data) == set(range(n))  # the whole set, the other workers' rows too
    first = [sampler.next()[1] for sampler in whole]
    assert not torch.equal(first[0], first[1])  # each worker its own order: different data at each step


def test_the_lm_text_is_split_the_same_way():
    data = load_dataset("lm")
    shard = data_plane.make_sampler("lm", data, 1, 4, 2, 0)
    whole = data_plane.make_sampler("lm", data, 1, 4, 2, 0, split="whole")
    assert len(shard.tokens) == len(data.x_train) // 4 and len(whole.tokens) == len(data.x_train)


def test_a_checkpoint_resumes_only_with_the_split_it_was_written_with(tmp_path):
    written = RunConfig(num_workers=2, iterations=2, checkpoint_dir=str(tmp_path), data_split="whole")
    (tmp_path / checkpoint.MANIFEST).write_text(json.dumps(checkpoint.fingerprint(written)))
    again = RunConfig(num_workers=2, iterations=2, checkpoint_dir=str(tmp_path), resume=True, data_split="shard")
    with pytest.raises(OptionError, match="data_split was 'whole', now 'shard'"):
        checkpoint.prepare(str(tmp_path), again, resume=True)
