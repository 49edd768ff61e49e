"""Per-layer tensor dimensions at one level of the hierarchy, and how a split shrinks them.

At the top level every layer sees the whole batch and all features. A half
that received share ``s`` of a layer of type I sees ``s * B`` samples, of type
II ``s * Di`` input features, of type III ``s * Do`` output features. Dimensions
are kept as floats: the cost model is linear in them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetrain.planner.layers import INPUT, Net


@dataclass(frozen=True)
class Shapes:
    """``batch[i]``, ``d_in[i]``, ``d_out[i]`` of every layer i at one level (elements, floats)."""

    batch: tuple[float, ...]
    d_in: tuple[float, ...]
    d_out: tuple[float, ...]

    def __hash__(self) -> int:  # a memo key of every plan: hash the 3 x layers floats once
        try:
            return self._hash
        except AttributeError:
            object.__setattr__(self, "_hash", hash((self.batch, self.d_in, self.d_out)))
            return self._hash

    @classmethod
    def full(cls, net: Net, batch: int) -> Shapes:
        n = len(net.layers)
        return cls((float(batch),) * n, tuple(float(la.d_in) for la in net.layers),
                   tuple(float(la.d_out) for la in net.layers))

    def arrays(self):
        """``(batch, d_in, d_out)`` as numpy arrays, made once per shapes (read-only)."""
        try:
            return self._arrays
        except AttributeError:
            arrays = tuple(np.array(v) for v in (self.batch, self.d_in, self.d_out))
            for a in arrays:
                a.flags.writeable = False
            object.__setattr__(self, "_arrays", arrays)
            return arrays

    def sizes(self, net: Net):
        """Element counts (inputs, outputs, weights), one list entry per layer."""
        ins = [b * di * la.hw_in for b, di, la in zip(self.batch, self.d_in, net.layers)]
        outs = [b * do * la.hw_out for b, do, la in zip(self.batch, self.d_out, net.layers)]
        ws = [di * do * la.kernel for di, do, la in zip(self.d_in, self.d_out, net.layers)]
        return ins, outs, ws

    def split(self, types, share: float) -> Shapes:
        """The shapes one half sees when layer i of type ``types[i]`` gives it ``share`` of its split dim."""
        b, di, do = dims = list(self.batch), list(self.d_in), list(self.d_out)
        for i, t in enumerate(types):
            dims[t][i] *= share
        return Shapes(tuple(b), tuple(di), tuple(do))

    def train_flops(self, net: Net) -> float:
        """FLOPs of one training step on these shapes: forward, weight gradient, input error.

        The first layer skips the input error (nobody needs it), so it costs 2x its forward.
        """
        total = 0.0
        firsts = first_layers(net)
        for i, la in enumerate(net.layers):
            fwd = 2.0 * self.batch[i] * self.d_in[i] * self.d_out[i] * la.kernel * la.hw_out
            total += fwd * (2.0 if i in firsts else 3.0)
        return total

    def memory_bytes(self, net: Net, bytes_per_elem: float) -> float:
        """Bytes one device holds: weights and their gradients, plus each layer's input kept for backward."""
        ins, _, ws = self.sizes(net)
        return (2.0 * sum(ws) + sum(ins)) * bytes_per_elem


def first_layers(net: Net) -> set[int]:
    return {n.index for n in net.nodes if n.kind == "layer" and n.producers == (INPUT,)}
