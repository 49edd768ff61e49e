"""The tensors a protocol averages, as one flat buffer: parameters and floating-point buffers.

Averaging protocols move a model as one flat tensor (one message or one
collective per synchronization, not one per layer). :class:`FlatState` packs a
module's parameters *and* its floating-point buffers (BatchNorm's running mean
and variance: leaving them un-averaged made each worker evaluate with its own
statistics) into one buffer, and unpacks it back.

Mixed dtypes: the buffer has the widest floating dtype among the tensors
(float64 > float32 > bfloat16/float16; bfloat16 with float16 travel as
float32), so every value is averaged at least at its own precision and
written back in its own dtype. Integer buffers (``num_batches_tracked``) are
counters, not state to average: they stay local.

A protocol with an outer optimizer appends the optimizer's *anchors* (``extra``): the
protocols then average the anchors with the same weights as the models (see
:mod:`hetrain.runtime.outer_step`). ``model_numel`` counts the module's part alone.

Flat buffers come from a :class:`~hetrain.transport.buffer_pool.BufferPool`: at
100 MB a fresh allocation per step costs more kernel time than the step's math.
"""

from __future__ import annotations

import torch
from torch import nn

from hetrain.transport.buffer_pool import BufferPool

_WIDTH = {torch.float64: 3, torch.float32: 2, torch.bfloat16: 1, torch.float16: 1}


class FlatState:
    def __init__(self, module: nn.Module, extra: list[torch.Tensor] = ()):
        self.tensors = [p for p in module.parameters()]
        self.tensors += [b for b in module.buffers() if b.is_floating_point()]
        self.model_numel = sum(t.numel() for t in self.tensors)
        self.model_tensors = list(self.tensors)  # the module's part alone, the model's own tensors
        self.tensors += list(extra)
        if not self.tensors:
            raise ValueError("the model has no parameters or floating-point buffers to average")
        devices = {t.device for t in self.tensors}
        if len(devices) > 1:
            raise ValueError(f"the model's tensors are on several devices ({sorted(map(str, devices))}); "
                             "hetrain averages a model that lives on one device")
        self.device = devices.pop()
        dtypes = {t.dtype for t in self.tensors}
        self.dtype = max(dtypes, key=lambda d: _WIDTH.get(d, 0))
        if self.dtype in (torch.bfloat16, torch.float16) and len(dtypes) > 1:
            self.dtype = torch.float32
        self.numel = sum(t.numel() for t in self.tensors)
        self.pool = BufferPool(self.numel, self.dtype, self.device)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def gather(self) -> torch.Tensor:
        """A flat copy that shares memory with nothing in use (not the model, not another gather)."""
        return torch.cat([t.detach().reshape(-1).to(self.dtype) for t in self.tensors], out=self.pool.take())

    @property
    def model_nbytes(self) -> int:
        return self.model_numel * torch.empty((), dtype=self.dtype).element_size()

    def gather_model(self) -> torch.Tensor:
        """The module's part alone (no anchors), as a flat copy (snapshots, evaluation)."""
        flat = self.gather()
        return flat if self.model_numel == self.numel else flat[: self.model_numel].clone()

    def scatter(self, flat: torch.Tensor) -> None:
        """Copy ``flat`` (from :meth:`gather`, possibly averaged) back into the model's tensors."""
        if flat.numel() != self.numel:
            raise ValueError(f"flat buffer has {flat.numel()} elements, the model {self.numel}")
        offset = 0
        with torch.no_grad():
            for t in self.tensors:
                count = t.numel()
                t.copy_(flat[offset : offset + count].view_as(t))
                offset += count

    def empty(self) -> torch.Tensor:
        """An uninitialised buffer of the flat layout (to receive or mix into), from the pool."""
        return self.pool.take()


def averaged_nbytes(module: nn.Module, anchors: bool = False) -> int:
    """Bytes of the flat buffer a protocol averages for ``module`` (a model on ``meta`` will do: nothing is
    allocated); ``anchors``: an outer optimizer's anchors travel with it, counted as a second model."""
    return FlatState(module).nbytes * (2 if anchors else 1)
