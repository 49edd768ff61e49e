"""A P-Reduce whose messages are compressed: CHOCO-SGD's public copies, kept per member set.

A group's members do not hold each other's models, so what one sends cannot be
a difference from what the others hold, unless they keep copies. Here every
member set that has a communicator in the cache (:mod:`hetrain.groups.preduce`)
also keeps, on each of its members, a public copy of every member's model, all
members' copies identical. The set's first P-Reduce is a plain one; afterwards
each member sends ``C(x_i - x̂_i)`` (an all-gather of compressed bytes), every
member adds every decoded difference to the copies, and moves toward their
average:

    x_i <- x_i + gamma * (mean_j x̂_j - x̂_i)

which keeps the group's sum of models (what the group averages is not changed
by the compression) and, with gamma = 1 and no loss, is the plain average.
What a compressor drops stays in ``x_i - x̂_i`` and is sent later (error feedback).
The copies live and are evicted with the set's communicator (the same points
on every member), so each member holds ``group size`` copies per cached set:
memory that the communicator cache's size bounds, itself sized to ``comm_memory_mb``
(:mod:`hetrain.protocols.comm_budget`). Weighted averages
(``local_work="auto"``) weight the copies by the local steps each member sent.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hetrain.compression.codecs import Codec


class GroupReplicas:
    """Public copies of one member set's models (index = position in the sorted member tuple)."""

    def __init__(self, average: torch.Tensor, size: int):
        self.publics = [average.detach().clone() for _ in range(size)]

    @property
    def nbytes(self) -> int:
        return sum(public.numel() * public.element_size() for public in self.publics)


def compressed_exchange(comm, buf: torch.Tensor, index: int, size: int, codec: Codec, replicas: GroupReplicas,
                        gamma: float, weight: float | None, wait: Callable[[object], None]) -> int:
    """Move ``buf`` (this member's model, in place) toward the group's public average; return bytes sent.
    ``wait(work)`` waits for the all-gather (within the caller's timeout)."""
    publics = replicas.publics
    payload = codec.encode(buf - publics[index])
    extra = torch.tensor([1.0 if weight is None else float(weight)], dtype=torch.float32, device=buf.device)
    message = torch.cat([payload, extra.view(torch.uint8)])
    gathered = [torch.empty_like(message) for _ in range(size)]
    wait(comm.allgather([gathered], [message]))
    weights = []
    for member, received in enumerate(gathered):
        codec.add_decoded(received[:-4], publics[member])
        weights.append(float(received[-4:].clone().view(torch.float32)))  # (a copy: 4-byte aligned)
    total = sum(weights)
    # mean_w(x̂) - x̂_i = sum over the others of w_j / total * (x̂_j - x̂_i): two passes a partner, not
    # a zeroed target, an add a member and a subtraction (a pair: 2 passes of the buffer, not 5)
    own = publics[index]
    for member, (public, w) in enumerate(zip(publics, weights)):
        if member != index:
            buf.add_(torch.sub(public, own), alpha=gamma * w / total)
    return message.numel()
