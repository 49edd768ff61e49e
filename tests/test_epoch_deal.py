"""Each epoch's batches dealt out over the workers present (hetrain.epoch_deal): none drawn twice or left
out within an epoch, however the members change. The data are the samples' own indices, so the test sees
exactly which samples each worker took."""

import random

import torch
import torch.distributed as dist

from hetrain.epoch_deal import EpochSampler, StoreClaims, dealt_epochs

SAMPLES = 103  # not a multiple of the batch: the last batch of each epoch is short
BATCH = 8


def _worker(store, seed: int = 7) -> EpochSampler:
    samples = torch.arange(SAMPLES)
    return EpochSampler(samples, samples, BATCH, seed, StoreClaims(store))


def _take(sampler: EpochSampler, seen: dict) -> None:
    """One batch; note which epoch each of its samples came from (the sampler's epoch as it returned)."""
    x, y = sampler.next()
    assert torch.equal(x, y)
    seen.setdefault(sampler.epoch, []).extend(x.tolist())


def test_workers_at_different_speeds_that_join_and_leave_take_each_sample_once_per_epoch():
    store = dist.HashStore()
    members = {0: _worker(store), 1: _worker(store)}
    seen: dict[int, list[int]] = {}
    steps = random.Random(0)
    for step in range(400):
        if step == 60:  # two join mid-epoch
            members[2], members[3] = _worker(store), _worker(store)
            joined_in = {rank: None for rank in (2, 3)}
        if step == 250:  # one leaves between two steps
            del members[1]
        for rank, sampler in members.items():
            for _ in range(1 + rank * steps.randint(0, 2)):  # the workers differ in speed, from step to step
                _take(sampler, seen)
            if rank in (2, 3) and joined_in[rank] is None:
                joined_in[rank] = sampler.first_epoch
    last = max(seen)
    assert last >= 20
    for epoch in range(last):  # every epoch that is over: each sample exactly once
        assert sorted(seen[epoch]) == list(range(SAMPLES)), f"epoch {epoch}"
    assert len(seen[last]) == len(set(seen[last]))
    # the joiners started in the epoch under way (not at epoch 0) and took their share of it
    assert joined_in[2] == joined_in[3] >= 3
    orders = [seen[e][:BATCH] for e in range(3)]
    assert orders[0] != orders[1] != orders[2]  # each epoch its own order


def test_the_record_adds_up_each_epoch_over_its_workers_and_names_one_that_is_short():
    store = dist.HashStore()
    workers = [_worker(store) for _ in range(3)]
    for step in range(200):
        workers[step % 3].next()
        if step % 2:
            workers[0].next()
    records = [w.record() for w in workers]
    assert all(r["batches_per_epoch"] == 13 for r in records)  # ceil(103 / 8)
    deal = dealt_epochs(records)
    assert deal["epochs_checked"] == 300 // 13 and deal["short"] == [] and deal["over"] == []
    assert sum(sum(r["batches"]) for r in records) == 300
    # a worker whose record is missing (it died): the epochs it took part in are short
    assert dealt_epochs(records[1:])["short"]


def test_a_worker_keeps_the_newest_epochs_counts_only_and_the_check_starts_after_what_it_dropped():
    store = dist.HashStore()
    samples = torch.arange(SAMPLES)
    kept = EpochSampler(samples, samples, BATCH, 7, StoreClaims(store), keep=5)
    other = _worker(store)
    for _ in range(13 * 12):  # 24 epochs of 13 batches between them: the last one (23) is under way
        kept.next()
        other.next()
    record = kept.record()
    assert len(record["batches"]) == 5 and record["trimmed"] and record["first_epoch"] == 23 - 4
    deal = dealt_epochs([record, other.record()])
    assert deal["first_checked"] == 19 and deal["epochs_checked"] == 4 and deal["short"] == deal["over"] == []


def test_a_checkpoint_keeps_the_epoch_and_a_resumed_job_deals_it_anew():
    store = dist.HashStore()
    first = _worker(store)
    for _ in range(30):  # into epoch 2
        first.next()
    state = first.state_dict()
    resumed = _worker(dist.HashStore())  # a resumed job's store counts from 0
    resumed.load_state_dict(state)
    seen: dict[int, list[int]] = {}
    for _ in range(13):
        _take(resumed, seen)
    assert sorted(seen[2]) == list(range(SAMPLES))
