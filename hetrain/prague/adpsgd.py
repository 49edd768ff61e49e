"""AD-PSGD (Lian et al., ICML'18) as a baseline: atomic pairwise averaging, active/passive split.

After each local step an active (even-rank) worker averages its model with a
random passive (odd-rank) worker; a passive worker, at each of its syncs,
serves the pairs actives queued for it, one after another. The pairing is pure
logic (:mod:`hetrain.prague.adpsgd_pairing`), served by rank 0 like Prague's
GG; each pair runs as a P-Reduce of two. As in Prague, the local step comes
before the averaging (the paper overlaps them; the averaging is the same).
"""

from __future__ import annotations

from hetrain.errors import UsageError
from hetrain.prague.adpsgd_pairing import ActivePassivePairing
from hetrain.prague.protocol import GroupProtocol


class ADPSGD(GroupProtocol):
    name = "adpsgd"

    def __init__(self, model, ctx, *, communicator_cache: int = 60, seed: int = 0):
        if communicator_cache < 1:
            raise UsageError(f"--communicator-cache must be >= 1, got {communicator_cache}")
        scheduler = ActivePassivePairing(ctx.world_size, seed=seed, cache_size=communicator_cache)
        super().__init__(model, ctx, scheduler, communicator_cache=communicator_cache)
        self.stats.extra["role"] = "active" if scheduler.is_active(ctx.rank) else "passive"

    @classmethod
    def from_config(cls, model, ctx, config) -> ADPSGD:
        return cls(model, ctx, communicator_cache=config.communicator_cache, seed=config.seed)
