"""A residual model on digits for ``hetrain plan --train --workload cnn-residual`` (imports torch)."""

from __future__ import annotations

from torch import nn


class ResidualDigitsCNN(nn.Module):
    """A residual block on digits: stem, (conv, ReLU, conv) + the stem's output, a linear head.

    Written the way the planner's executor re-creates networks (pre-activation: nothing after the
    addition, no ReLU on a layer that feeds it), so a plan trains this very function."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.stem = nn.Conv2d(1, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.head = nn.Linear(channels * 64, 10)

    def forward(self, x):
        s = self.stem(x.reshape(-1, 1, 8, 8))
        h = self.conv2(self.conv1(s).relu())
        return self.head((s + h).flatten(1))
