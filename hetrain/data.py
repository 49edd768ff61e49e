"""Built-in workloads that need no download: scikit-learn's digits, a synthetic task, a small LM.

* ``mlp`` / ``cnn`` on digits (1,797 8x8 images, 10 classes; 80/20 stratified split);
* ``synthetic``: Gaussian inputs labelled by a random linear teacher, learned by a
  two-layer MLP whose hidden width is chosen so the model has about ``model_params``
  parameters -- to set the communication volume to realistic sizes;
* ``lm``: a byte-level GPT on Python's documentation text (:mod:`hetrain.lm`).

Each worker trains on its own shard of the training set with its own seed, or (``split="whole"``)
on the whole set with its own seed: with a worker that is always slow, its shard is sampled a
fraction as often as the others' and the job under-fits it (docs/decisions/hop-uses-late-updates.md, "The straggler's
shard"); drawing from the whole set leaves no part of the data behind.
One loss for all (cross-entropy over the last dimension of the logits) and one
evaluation, :func:`evaluate`: (accuracy, loss) on the test/validation set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

NUM_CLASSES = 10
SYNTHETIC_FEATURES = 64


@dataclass
class Dataset:
    """A workload's tensors. Pickled as numpy arrays: the launcher loads the data once and hands it to its
    workers, and torch's own pickling of tensors between processes goes through shared memory that
    the sender must keep alive."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    image_shape: tuple = (1, 8, 8)

    def __reduce__(self):
        arrays = tuple(t.numpy() for t in (self.x_train, self.y_train, self.x_test, self.y_test))
        return _dataset_from_arrays, (arrays, self.image_shape)


def _dataset_from_arrays(arrays: tuple, image_shape: tuple) -> Dataset:
    # arrays that arrive read-only (a Ray object, mapped from its store) are copied: tensors own writable memory
    return Dataset(*(torch.from_numpy(a if a.flags.writeable else a.copy()) for a in arrays), image_shape=image_shape)


def load_dataset(workload: str, seed: int = 0) -> Dataset:
    if workload == "synthetic":
        return _synthetic(seed)
    if workload == "lm":
        from hetrain.lm import load_text, validation_windows

        train, val = load_text()
        x_val, y_val = validation_windows(val)
        return Dataset(train, train, x_val, y_val, image_shape=())
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    return Dataset(torch.from_numpy(x_train), torch.from_numpy(y_train).long(),
                   torch.from_numpy(x_test), torch.from_numpy(y_test).long())


def _synthetic(seed: int, train: int = 4096, test: int = 1024) -> Dataset:
    gen = torch.Generator().manual_seed(1234 + seed)
    teacher = torch.randn(SYNTHETIC_FEATURES, NUM_CLASSES, generator=gen)
    x = torch.randn(train + test, SYNTHETIC_FEATURES, generator=gen)
    y = (x @ teacher).argmax(dim=1)
    return Dataset(x[:train], y[:train], x[train:], y[train:])


def build_model(workload: str, model_params: int = 1_000_000, seed: int = 0) -> nn.Module:
    """The same initial model on every worker (seeded), so averaging starts from consensus."""
    torch.manual_seed(seed)
    if workload == "lm":
        from hetrain.lm import GPT

        return GPT()
    if workload == "mlp":
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, NUM_CLASSES))
    if workload == "cnn":
        return nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)),
            nn.Conv2d(1, 8, 3), nn.ReLU(),
            nn.Conv2d(8, 16, 3), nn.ReLU(),
            nn.Flatten(), nn.Linear(16 * 4 * 4, NUM_CLASSES),
        )
    hidden = max(1, round((model_params - NUM_CLASSES) / (SYNTHETIC_FEATURES + 1 + NUM_CLASSES)))
    return nn.Sequential(nn.Linear(SYNTHETIC_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, NUM_CLASSES))


def make_sampler(workload: str, data: Dataset, rank: int, world_size: int, batch_size: int, seed: int,
                 split: str = "shard"):
    """Worker ``rank``'s endless batches: ``sampler.next() -> (x, y)``; ``split``: ``shard`` (its own slice),
    ``whole`` (the whole training set; the seed is still the worker's own) or ``balanced`` (its own slice, and
    the slices of workers slower than the fair rate while it is faster: :mod:`hetrain.shard_balance`; the
    rates come through ``sampler.set_rates``)."""
    shards = 1 if split == "whole" else world_size
    if workload == "lm":
        from hetrain.lm import TextSampler

        build = lambda shard: TextSampler(data.x_train, shard, world_size, batch_size, seed, shards=shards)  # noqa: E731
    else:
        build = lambda shard: ShardSampler(data, shard, world_size, batch_size, seed, shards=shards)  # noqa: E731

    def of_shard(shard: int, generator_seed: int | None = None):
        sampler = build(shard)
        if generator_seed is not None:  # a shard drawn by another worker than its owner: that worker's own order
            sampler.gen.manual_seed(generator_seed)
        return sampler

    if split == "balanced" and world_size > 1:
        from hetrain.shard_balance import BalancedSampler

        return BalancedSampler(of_shard, rank, world_size, seed)
    return of_shard(rank)


def check_batch_fits(workload: str, data: Dataset, batch_size: int, world_size: int, split: str = "shard") -> None:
    """OptionError when a batch is larger than a worker's slice of the training set (a sampler would cut it to
    the slice, and the figures would count samples never drawn)."""
    if workload == "lm":  # its batches are windows of a text, not a slice's examples
        return
    shards = 1 if split == "whole" else world_size
    smallest = len(data.x_train) // shards
    if batch_size > smallest:
        from hetrain.protocols.options import OptionError

        raise OptionError(f"{{batch_size}} {batch_size} is more than a worker's {smallest} training examples "
                          f"({len(data.x_train)} split over {shards}): use at most {smallest}, or fewer workers")


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every prediction: (B, C) logits for classes, (B, T, 256) for bytes."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def make_optimizer(name: str, params, lr: float, momentum: float) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


class ShardSampler:
    """Endless shuffled mini-batches from worker ``rank``'s shard (rank::shards of the training set; by default
    one shard per worker, ``shards=1``: the whole set)."""

    def __init__(self, data: Dataset, rank: int, world_size: int, batch_size: int, seed: int,
                 shards: int | None = None):
        shards = world_size if shards is None else shards
        self.x = data.x_train[rank % shards::shards]
        self.y = data.y_train[rank % shards::shards]
        self.batch_size = min(batch_size, len(self.x))
        self.gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
        self._order = torch.empty(0, dtype=torch.long)
        self._pos = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pos + self.batch_size > len(self._order):
            self._order = torch.randperm(len(self.x), generator=self.gen)
            self._pos = 0
        index = self._order[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return self.x[index], self.y[index]

    def state_dict(self) -> dict:
        return {"generator": self.gen.get_state(), "order": self._order.clone(), "pos": self._pos}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["generator"])
        self._order = state["order"]
        self._pos = int(state["pos"])


EVAL_CHUNK = 128  # samples per forward pass when evaluating (a 25M synthetic model's hidden layer
# on 1,024 test samples at once was 1.4 GB per activation: the largest memory peak of a run)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(accuracy, mean cross-entropy loss) of ``model`` on ``x``, ``y`` (every prediction counts; no autograd)."""
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, len(x), EVAL_CHUNK):
        logits = model(x[start : start + EVAL_CHUNK])
        target = y[start : start + EVAL_CHUNK]
        correct += (logits.argmax(dim=-1) == target).sum().item()
        loss_sum += float(loss_fn(logits, target)) * target.numel()
    model.train(was_training)
    return correct / y.numel(), loss_sum / y.numel()


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return evaluate(model, x, y)[0]
