"""The interface every synchronization protocol implements.

A training loop uses a protocol like this::

    sync = hetrain.Hop(model, ctx, topology="ring", backup=1)
    while not sync.should_stop(local_done=it >= iterations):
        loss = loss_fn(sync.module(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        sync.step()                      # synchronise after the optimizer step
    sync.finish()                        # drain; every worker ends with the consensus model
    print(sync.metrics())

``step`` accounts time: the time since the previous ``step`` returned is
compute, the time inside ``step`` is waiting (communication the protocol could
not hide). Subclasses implement ``_sync``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from hetrain.runtime.context import WorkerContext


@dataclass
class ProtocolStats:
    """Counters every protocol reports (per worker); protocol-specific ones go in ``extra``."""

    iterations: int = 0  # iterations whose gradient this worker computed
    iteration: int = 0  # the worker's iteration counter (jumps when Hop skips)
    skipped_iterations: int = 0
    compute_s: float = 0.0
    wait_s: float = 0.0
    updates_stale: int = 0
    updates_dropped: int = 0
    max_iteration_gap: int = 0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        data = asdict(self)
        data.update(data.pop("extra"))
        return data


class SyncProtocol:
    """Base class: timing, stop agreement, and the step/finish template."""

    name = "base"

    def __init__(self, model: nn.Module, ctx: WorkerContext):
        self.model = model
        self.ctx = ctx
        self.stats = ProtocolStats()
        self._last_step_end: float | None = None

    @property
    def module(self) -> nn.Module:
        """The module to run forward on (DistributedDataParallel wraps it; others return it)."""
        return self.model

    def start(self) -> None:
        """Mark the start of the first iteration's compute (called by the first ``should_stop``)."""
        if self._last_step_end is None:
            self._last_step_end = time.perf_counter()

    def step(self) -> None:
        """Synchronise after an optimizer step."""
        now = time.perf_counter()
        if self._last_step_end is not None:
            self.stats.compute_s += now - self._last_step_end
        self.stats.iterations += 1
        self.stats.iteration += 1  # protocols that skip iterations overwrite this in _sync
        self._sync()
        end = time.perf_counter()
        self.stats.wait_s += end - now
        self._last_step_end = end

    def _sync(self) -> None:
        raise NotImplementedError

    @classmethod
    def check_config(cls, config) -> None:
        """Validate a RunConfig for this protocol before any process starts (raise UsageError)."""

    def should_stop(self, local_done: bool) -> bool:
        """Whether to leave the loop; ``local_done`` is this worker's own wish.

        Protocols whose workers must leave together (All-Reduce) override this
        to agree; decentralized ones let each worker stop on its own and drain.
        """
        self.start()
        return bool(local_done)

    def finish(self) -> None:
        """Drain outstanding messages and leave every worker with the consensus model."""

    def metrics(self) -> dict:
        return self.stats.as_dict()


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """A detached copy of all parameters as one flat buffer (one message or collective per sync).

    ``parameters_to_vector`` concatenates into fresh memory, so the result shares nothing with
    the model (no extra clone: for a 100 MB model that was 100 MB more per call).
    """
    return torch.nn.utils.parameters_to_vector([p.detach() for p in model.parameters()])


def load_flat_parameters(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy a flat buffer made by :func:`flat_parameters` back into the model."""
    offset = 0
    with torch.no_grad():
        for param in model.parameters():
            count = param.numel()
            param.copy_(flat[offset : offset + count].view_as(param))
            offset += count
