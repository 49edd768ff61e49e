"""Batches shared out by speed: each rank takes the next batch of the epoch when it is ready for one.

A static shard (DistributedSampler) gives every rank the same number of batches,
so an epoch lasts as long as the slowest rank needs for its share, whatever the
protocol. Here every rank walks the same permutation of the whole dataset (the
same seed and epoch on every rank) and claims batch numbers from one counter on
the job's c10d store: a rank three times faster takes three times the batches,
and every rank runs out within about one batch of the others. An epoch still
trains on each sample once (the last batch may be short unless ``drop_last``).

Claims are atomic (``store.add``), one round trip to the store per batch. Each pass over an epoch
claims from a counter of its own: an epoch rewound (a checkpoint loaded mid-run sets it back to the
saved one) is a full pass again, not one whose batches were all claimed already (every rank rewinds
alike, so they agree on which pass they are on). A
batch claimed by an iterator that is dropped before using it is lost to the
epoch (a data loader prefetching when the loop ends early, for instance).

A shared epoch's length (its batches over all ranks) does not tell a rank which
of its batches is its last; :class:`LastBatchKnown` does, from the batches the
loader hands out (a multi-worker loader draws index batches, and so claims,
several ahead of those it hands out).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Sampler


class EpochOrder(Sampler):
    """The order of one epoch's samples: the same on every rank (seeded by ``seed`` and the epoch).
    Lightning (as torch's ``DistributedSampler`` users do) calls ``set_epoch`` on a batch sampler's ``sampler``."""

    def __init__(self, num_samples: int, shuffle: bool = True, seed: int = 0):
        self.num_samples = num_samples
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        if not self.shuffle:
            return iter(range(self.num_samples))
        return iter(torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + self.epoch))
                    .tolist())


class SharedBatches(Sampler):
    """A batch sampler whose epochs are shared out among ranks by a counter on ``store``.

    ``store``: the job's store under a prefix of this sampler's own (every rank's
    sampler must use the same one). Its length is the epoch's batches over all ranks (an upper
    bound on what one rank takes, so a loop or a scheduler sized by it never runs past it);
    :attr:`position` says how far the job has got over all ranks, for schedules that follow the
    whole job's progress rather than one rank's steps.
    """

    def __init__(self, num_samples: int, batch_size: int, store, *, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.store = store
        self.drop_last = drop_last
        self.sampler = EpochOrder(num_samples, shuffle, seed)
        self.taken = 0  # batches this rank took in its current or last epoch
        self.limit: int | None = None  # at most this many batches per epoch over all ranks (None: all)
        self.claimed = 0  # batches of the current epoch claimed over all ranks, as of this rank's last claim
        self.exhausted = False  # this rank's claim found the epoch's batches all claimed (its iterator ended)
        self.passes: dict[int, int] = {}  # epoch -> passes over it begun on this rank (more than 1: rewound)

    @property
    def num_batches(self) -> int:
        """Batches per epoch, over all ranks."""
        batches = self._all_batches()
        return batches if self.limit is None else min(batches, self.limit)

    def _all_batches(self) -> int:
        full, rest = divmod(self.num_samples, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def __len__(self) -> int:
        """The epoch's batches before :attr:`limit` (Lightning scales a loader's length by its own
        ``limit_train_batches``, which is where the limit comes from)."""
        return self._all_batches()

    @property
    def position(self) -> int:
        """Batches claimed over all ranks since epoch 0, as of this rank's last claim."""
        return self.sampler.epoch * self.num_batches + self.claimed

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        """This rank's batches of the epoch, each claimed when the loader asks for it."""
        order = list(self.sampler)
        self.taken = self.claimed = 0
        self.exhausted = False
        key = claims_key(self.sampler.epoch, self.passes.get(self.sampler.epoch, 0))
        self.passes[self.sampler.epoch] = self.passes.get(self.sampler.epoch, 0) + 1
        while True:
            batch = self.store.add(key, 1) - 1
            if batch >= self.num_batches:
                self.claimed, self.exhausted = self.num_batches, True
                return
            self.claimed = batch + 1
            self.taken += 1
            yield order[batch * self.batch_size:(batch + 1) * self.batch_size]


def claims_key(epoch: int, earlier_passes: int) -> str:
    """The store's counter of an epoch's claims: ``epoch/E`` on its first pass, ``epoch/E/pass/K`` on a
    rewound epoch's pass K (each pass claims every batch afresh)."""
    return f"epoch/{epoch}" if earlier_passes == 0 else f"epoch/{epoch}/pass/{earlier_passes}"


class LastBatchKnown(DataLoader):
    """A DataLoader whose iterator draws one batch ahead of those it hands out, so that :attr:`last` says
    whether the batch it handed out last is this rank's last of the epoch (Lightning closes an accumulation
    window with an optimizer step and validates at an epoch's end, and a shared epoch's length does not say
    which batch that is). Drawing ahead costs nothing with workers (they prefetch), and without them it is the
    one-batch look-ahead a rank needs to know its last batch at all."""

    last = False

    def __iter__(self):
        return _DrawnAhead(super().__iter__(), self)


_UNDRAWN, _END = object(), object()


class _DrawnAhead:
    def __init__(self, iterator, loader: LastBatchKnown):
        self.iterator = iterator
        self.loader = loader
        self.ahead = _UNDRAWN
        loader.last = False

    def __iter__(self):
        return self

    def __next__(self):
        if self.ahead is _UNDRAWN:
            self.ahead = next(self.iterator, _END)
        if self.ahead is _END:
            raise StopIteration
        batch, self.ahead = self.ahead, next(self.iterator, _END)
        self.loader.last = self.ahead is _END
        return batch


def with_batch_sampler(dataloader: DataLoader, batch_sampler: Sampler, loader_class: type = DataLoader) -> DataLoader:
    """``dataloader`` with its batches drawn from ``batch_sampler``; every other setting kept (as a
    ``loader_class``: :class:`LastBatchKnown` to know a rank's last batch)."""
    return loader_class(dataloader.dataset, batch_sampler=batch_sampler, num_workers=dataloader.num_workers,
                        collate_fn=dataloader.collate_fn, pin_memory=dataloader.pin_memory,
                        timeout=dataloader.timeout, worker_init_fn=dataloader.worker_init_fn,
                        multiprocessing_context=dataloader.multiprocessing_context, generator=dataloader.generator,
                        prefetch_factor=dataloader.prefetch_factor, persistent_workers=dataloader.persistent_workers,
                        pin_memory_device=dataloader.pin_memory_device)
