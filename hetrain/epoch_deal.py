"""Each epoch's batches dealt out over the workers present (``--data-split balanced`` in a job that may grow).

Every worker holds the same order of the training set for epoch ``e`` (a permutation seeded by the run's
seed and ``e``), cut into ``ceil(N / batch_size)`` batches (the last one short: no sample is left out).
A worker takes its next batch by adding 1 to the epoch's counter in the job's store: the add is atomic,
so each batch goes to exactly one worker, and a worker takes as many as its speed lets it. When the
counter passes the epoch's end, the epoch is done and the worker goes on to the next one; the one that
passed first writes the new epoch down, where a worker that joins (or replaces a dead one) starts.
So within an epoch no sample is drawn twice or left out, however the members change: a joining
worker's batches are the ones the others would have taken next, a leaving one's are taken by the
others. A worker that dies loses the batch it was computing (at most one); a graceful leave finishes
its step first. See docs/decisions/elastic-jobs-deal-each-epoch.md.

Each worker counts the batches it took in each epoch (the newest ``KEEP_EPOCHS``), so the run's record
can show that the counts add up to the epoch's batches.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

KEEP_EPOCHS = 1024  # epochs whose counts a worker keeps (a few KB): the newest ones


class StoreClaims:
    """The epochs' counters in the job's c10d store (``FileStore`` locally, the driver's ``TCPStore`` on Ray)."""

    def __init__(self, store):
        self.store = dist.PrefixStore("deal/", store)

    def claim(self, epoch: int) -> int:
        """The index of the next batch of ``epoch`` no one took yet (at or past its end: the epoch is done)."""
        return int(self.store.add(str(epoch), 1)) - 1

    def announce(self, epoch: int) -> None:
        """``epoch`` has begun: where a worker that joins starts."""
        self.store.set("now", str(epoch))

    def current(self) -> int:
        """The newest epoch begun (0 before any)."""
        return int(self.store.get("now")) if self.store.check(["now"]) else 0


class EpochSampler:
    """This worker's batches, dealt from the job's epochs through ``claims`` (:class:`StoreClaims`)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int, claims, keep: int = KEEP_EPOCHS):
        self.x, self.y = x, y
        self.batch_size = min(batch_size, len(x))
        self.batches_per_epoch = math.ceil(len(x) / self.batch_size)
        self.seed = seed
        self.claims = claims
        self.keep = keep
        self.epoch = None  # the epoch this worker takes from (None: the job's current one, read at the first batch)
        self._order = None
        self.first_epoch = None  # of the counts kept
        self.taken: list[int] = []  # batches taken in each epoch from first_epoch on
        self.trimmed = False  # older counts dropped (beyond keep)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.epoch is None:
            self._enter(self.claims.current())
        while (index := self.claims.claim(self.epoch)) >= self.batches_per_epoch:
            if index == self.batches_per_epoch:  # the first to pass its end
                self.claims.announce(self.epoch + 1)
            self._enter(self.epoch + 1)
        self.taken[-1] += 1
        batch = self._order[index * self.batch_size:(index + 1) * self.batch_size]
        return self.x[batch], self.y[batch]

    def _enter(self, epoch: int) -> None:
        self.epoch = epoch
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + 104_729 * (epoch + 1))
        self._order = torch.randperm(len(self.x), generator=generator)
        if self.first_epoch is None:
            self.first_epoch = epoch
        self.taken.extend([0] * (epoch - (self.first_epoch + len(self.taken)) + 1))
        if len(self.taken) > self.keep:
            drop = len(self.taken) - self.keep
            del self.taken[:drop]
            self.first_epoch += drop
            self.trimmed = True

    def record(self) -> dict:
        """What this worker took, for its metrics (``epochs_dealt``)."""
        return {"batches_per_epoch": self.batches_per_epoch, "first_epoch": self.first_epoch,
                "batches": list(self.taken), "trimmed": self.trimmed}

    def state_dict(self) -> dict:
        """For checkpoints: the epoch it was in (a resumed job's store counts from 0 again, so that epoch is
        dealt anew)."""
        return {"epoch_deal": True, "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        if state.get("epoch_deal") and state.get("epoch") is not None:  # else another split's: the job's epoch
            self._enter(int(state["epoch"]))


def dealt_epochs(records: list[dict]) -> dict | None:
    """The run's check of the deal, from its workers' ``epochs_dealt`` records: for each epoch that every
    record covers and that is over (a later one began), whether its batches add up (``short``: fewer,
    a death's lost batch; ``over``: more, which the store's atomic add rules out)."""
    records = [r for r in records if r and r.get("first_epoch") is not None]
    if not records:
        return None
    per_epoch = records[0]["batches_per_epoch"]
    first = max([0] + [r["first_epoch"] for r in records if r["trimmed"]])
    last = max(r["first_epoch"] + len(r["batches"]) - 1 for r in records)  # the one under way: not counted
    totals = {e: 0 for e in range(first, last)}
    for r in records:
        for offset, count in enumerate(r["batches"]):
            if r["first_epoch"] + offset in totals:
                totals[r["first_epoch"] + offset] += count
    return {"batches_per_epoch": per_epoch, "epochs_checked": len(totals), "first_checked": first,
            "short": [e for e, n in totals.items() if n < per_epoch],
            "over": [e for e, n in totals.items() if n > per_epoch]}
