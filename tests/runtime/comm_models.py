"""The models and protocol set-ups the communication tests share (test_comm_protocols, test_outer_consensus)."""

import torch
from torch import nn

import hetrain


class Quadratic(nn.Module):
    """A model whose gradient is elementwise, so its results are bit-identical on any CPU."""

    def __init__(self, seed: int, size: int = 64):
        super().__init__()
        self.w = nn.Parameter(torch.randn(size, generator=torch.Generator().manual_seed(100 + seed),
                                          dtype=torch.float64))

    def loss(self, step: int, seed: int) -> torch.Tensor:
        target = torch.randn(self.w.numel(), generator=torch.Generator().manual_seed(1000 * step + seed),
                             dtype=torch.float64)
        return ((self.w - target) ** 2).sum()


def _train_steps(model: Quadratic, optimizer, steps: int, seed: int) -> None:
    for step in range(steps):
        optimizer.zero_grad()
        model.loss(step, seed).backward()
        optimizer.step()  # with a protocol, its step post-hook then synchronizes as it says


def _make(protocol: str, model, optimizer, **comm):
    return {"dpsgd": lambda: hetrain.DPSGD(model, optimizer, topology="ring", **comm),
            "hop": lambda: hetrain.Hop(model, optimizer, topology="ring", backup=0, staleness=0, skip_threshold=0,
                                       max_ig=2, **comm),
            "prague": lambda: hetrain.Prague(model, optimizer, gg="static", group_size=2, preduce_overlap=0, **comm),
            "adpsgd": lambda: hetrain.ADPSGD(model, optimizer, **comm),
            "ps": lambda: hetrain.ParameterServer(model, optimizer, staleness=0, **comm)}[protocol]()
