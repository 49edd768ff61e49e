"""Compressed gossip: send the difference from what the receivers already hold (CHOCO-SGD).

Koloskova, Stich and Jaggi (ICML'19). Every worker i has a *public copy* x̂_i of
its model, which each of its out-neighbours holds too. A message is
``C(x_i - x̂_i)`` compressed (:mod:`hetrain.compression.codecs`); sender and
receivers all add its decoded value to x̂_i, so they stay equal, and what the
compressor dropped stays in ``x_i - x̂_i`` and goes out with later messages (error
feedback). Mixing then moves a worker toward its neighbours' public copies:

    x_i <- x_i + gamma * (w_ii x̂_i + sum_j w_ij x̂_j - x̂_i)

which with no compression and gamma = 1 is the protocol's own average. A
neighbour that holds nothing of x̂_i yet (at the start, after a graph repair,
a replacement) gets a KEYFRAME: x̂_i itself, in full; then deltas.

:class:`PublicCopy` is the sender's side, :class:`ReplicaSet` the receiver's (one
replica per in-neighbour; each message leaves a snapshot for the protocol's queues).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hetrain.compression.codecs import Codec


class PublicCopy:
    """The sender's x̂ and the out-neighbours that hold it."""

    def __init__(self, codec: Codec):
        self.codec = codec
        self.public: torch.Tensor | None = None
        self.synced: set[int] = set()

    def prepare(self, model: torch.Tensor, dsts: list[int]) -> tuple[torch.Tensor | None, list[int],
                                                                        torch.Tensor | None, list[int]]:
        """(delta payload, its receivers, keyframe, its receivers) to send ``model`` to ``dsts``.

        Synced receivers get the compressed difference (x̂ moves by what it decodes to); the others
        get x̂ in full and are synced from then on. With no synced receiver at all, x̂ becomes the model.
        A holder left out of a delta misses how x̂ moved: it is no longer synced.
        """
        delta_dsts = [d for d in dsts if d in self.synced]
        key_dsts = [d for d in dsts if d not in self.synced]
        delta = None
        if self.public is None or not self.synced:
            self.public = model.detach().clone()
        elif delta_dsts:
            delta = self.codec.encode(model - self.public)
            self.codec.add_decoded(delta, self.public)
            self.synced &= set(dsts)  # a holder this delta skips no longer holds x̂: a keyframe next
        keyframe = self.public.clone() if key_dsts else None
        self.synced.update(key_dsts)
        return delta, delta_dsts, keyframe, key_dsts

    def seed(self, model: torch.Tensor, holders: list[int]) -> None:
        """x̂ is ``model``, which ``holders`` already hold (every worker started from it)."""
        if holders:
            self.public = model.detach().clone()
            self.synced.update(holders)

    def forget(self, dst: int) -> None:
        """``dst`` no longer holds x̂ (dead, or replaced by a new process)."""
        self.synced.discard(dst)


class ReplicaSet:
    """The receiver's copy of each in-neighbour's x̂."""

    def __init__(self, codec: Codec, new_buffer: Callable[[], torch.Tensor]):
        self.codec = codec
        self.new_buffer = new_buffer
        self.replicas: dict[int, torch.Tensor] = {}

    def keyframe(self, src: int, model: torch.Tensor) -> torch.Tensor:
        """``src``'s x̂ in full: keep it; return a snapshot the caller may keep."""
        self.replicas[src] = model
        return self.new_buffer().copy_(model)

    def delta(self, src: int, payload: torch.Tensor) -> torch.Tensor:
        """Add ``src``'s compressed difference to its replica; return a snapshot of the replica."""
        replica = self.replicas.get(src)
        if replica is None:
            raise RuntimeError(f"a compressed update from worker {src} before any keyframe from it "
                               "(the sender's and receiver's copies disagree)")
        self.codec.add_decoded(payload, replica)
        return self.new_buffer().copy_(replica)

    def public(self, src: int) -> torch.Tensor | None:
        return self.replicas.get(src)

    def forget(self, src: int) -> None:
        self.replicas.pop(src, None)


def choco_mix(own: torch.Tensor, own_public: torch.Tensor, self_weight: float, terms, gamma: float,
              out: torch.Tensor) -> torch.Tensor:
    """``own + gamma * (self_weight * own_public + sum(w * public_j) - own_public)`` into ``out``;
    ``terms``: (weight, public_j) pairs."""
    mixed = torch.mul(own_public, self_weight - 1.0, out=out)
    for weight, public in terms:
        mixed.add_(public, alpha=weight)
    if gamma != 1.0:
        mixed.mul_(gamma)
    return mixed.add_(own)
