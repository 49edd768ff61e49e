"""The pieces under HetrainStrategy that need no processes: batches shared out, deaths heard, the extras' error."""

import time

import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed

from hetrain.extras import require  # noqa: E402
from hetrain.integrations.liveness import SILENCE_S, StoreLiveness  # noqa: E402
from hetrain.integrations.shared_batches import SharedBatches  # noqa: E402


def test_ranks_drawing_at_different_speeds_cover_each_epoch_once_and_the_fast_one_takes_more():
    store = dist.HashStore()
    ranks = [SharedBatches(100, 8, store, seed=3) for _ in range(2)]
    for epoch in range(2):
        for sampler in ranks:
            sampler.set_epoch(epoch)
        fast, slow = (iter(s) for s in ranks)
        seen, done = [], [False, False]
        step = 0
        while not all(done):
            for r, it in enumerate((fast, slow)):
                if done[r] or (r == 1 and step % 3):  # the slow rank asks every third turn
                    continue
                batch = next(it, None)
                if batch is None:
                    done[r] = True
                else:
                    seen += batch
            step += 1
        assert sorted(seen) == list(range(100))  # every sample once; the last batch is short
        assert ranks[0].taken + ranks[1].taken == 13 and ranks[0].taken > 2 * ranks[1].taken
    orders = [list(SharedBatches(100, 8, dist.HashStore(), seed=3).sampler) for _ in range(2)]
    assert orders[0] == orders[1] != list(range(100))  # the same permutation on every rank


def test_a_rank_whose_heartbeat_stops_is_named_dead_and_one_not_yet_started_is_not():
    store = dist.HashStore()
    watcher = StoreLiveness.start(store, 0, 3, timeout_s=5)
    beating = StoreLiveness.start(store, 1, 3, timeout_s=5)
    heard = []
    watcher.on_death = heard.append
    try:
        time.sleep(0.5)
        beating.stop()  # rank 1 falls silent; rank 2 never started
        deadline = time.monotonic() + SILENCE_S + 2
        while not watcher.dead_workers() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watcher.dead_workers() == {1} and heard == [1]
    finally:
        watcher.stop()


def test_a_missing_extra_fails_in_one_line_naming_it():
    with pytest.raises(ImportError, match=r"^HetrainStrategy needs lightning: pip install 'hetrain\[lightning\]'$"):
        require("hetrain_no_such_package", "lightning", "HetrainStrategy")


def test_the_rebuilt_loader_keeps_every_setting_but_the_batches(processes):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from hetrain.integrations.shared_batches import with_batch_sampler

    original = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=2, num_workers=1, prefetch_factor=3,
                          timeout=7, persistent_workers=True, generator=torch.Generator().manual_seed(3),
                          collate_fn=lambda items: [x for (x,) in items])
    rebuilt = with_batch_sampler(original, [[4, 5], [0]])
    for setting in ("dataset", "num_workers", "prefetch_factor", "timeout", "persistent_workers", "generator",
                    "collate_fn", "pin_memory", "worker_init_fn", "multiprocessing_context"):
        assert getattr(rebuilt, setting) is getattr(original, setting), setting
    assert [[float(x) for x in batch] for batch in rebuilt] == [[4.0, 5.0], [0.0]]


def test_a_shared_loader_has_a_length_the_epoch_s_batches_over_all_processes():
    """`len(loader)` (sized schedulers, `step == len(loader) - 1`) raised TypeError on Accelerate's shared loader."""
    pytest.importorskip("accelerate")
    from torch.utils.data import DataLoader

    from hetrain.integrations.accelerate import SharedLoader

    sampler = SharedBatches(100, 8, dist.HashStore(), seed=3)
    loader = SharedLoader(DataLoader(list(range(100)), batch_sampler=sampler), sampler, "cpu")
    assert len(loader) == 13


def test_an_epoch_rewound_mid_run_is_a_full_pass_again_on_every_rank():
    """A checkpoint loaded mid-run sets the epoch back to the saved one (issue 68, item 7): the next pass over
    it shares out all its batches again, not none (they were claimed on its first pass)."""
    store = dist.HashStore()
    ranks = [SharedBatches(32, 8, store, seed=3) for _ in range(2)]

    def one_pass(epoch: int) -> list[int]:
        for sampler in ranks:
            sampler.set_epoch(epoch)
        iterators = [iter(s) for s in ranks]
        while iterators:  # the ranks take turns, as ranks running apart would
            for it in list(iterators):
                if next(it, None) is None:
                    iterators.remove(it)
        return [s.taken for s in ranks]

    passes = [sum(one_pass(epoch)) for epoch in (0, 1, 1, 1)]  # epochs 0 and 1, then rewound to 1 twice
    assert passes == [4, 4, 4, 4], passes
